// common/cuda/cuda_emu.cpp — the CPU emulator of CUDA: kernel launches on fibers, warp-scoped shuffles and
// votes, per-block shared memory, and the subset of the CUDA runtime API that kvpage calls (host memory
// standing in for device memory). The contract is in common/cuda/kvp_cuda_emu.h.
#include "common/cuda/kvp_cuda_emu.h"

#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define KVP_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVP_EMU_ASAN 1
#endif
#endif
#ifdef KVP_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace kvp_emu {
// One node of a captured graph. Kernel nodes own their parameters' copy (shared by the graphs and executable
// graphs made from one capture); copy and memset nodes hold pointers only, read when the node runs.
enum node_kind { NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET, NODE_EVENT };
struct node_t {
    node_kind kind = NODE_KERNEL;
    const char *name = nullptr;
    const void *func = nullptr;
    dim3 grid, block;
    size_t shmem = 0;
    body_fn body = nullptr;
    std::shared_ptr<void> ctx;
    void *dst = nullptr;
    const void *src = nullptr;
    size_t n = 0;
    cudaMemcpyKind copy_kind = cudaMemcpyDefault;
    int value = 0;
    cudaEvent_t event = nullptr;
};
} // namespace kvp_emu

struct CUstream_st {
    unsigned magic;
    unsigned flags;
    // capture state, under mem().mu
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread;               // the thread that began the capture
    std::vector<kvp_emu::node_t> nodes;   // recorded so far, in issue order
};
struct CUevent_st {
    unsigned magic;
    bool recorded;
    double t; // seconds, CLOCK_MONOTONIC
    bool captured; // last recorded inside a capture
};
struct CUgraph_st {
    unsigned magic;
    std::vector<kvp_emu::node_t> nodes;
};
struct CUgraphExec_st {
    unsigned magic;
    std::vector<kvp_emu::node_t> nodes;
};

namespace kvp_emu {

namespace {

constexpr unsigned kStreamMagic = 0x5354524du, kEventMagic = 0x45564e54u, kGraphMagic = 0x47524150u,
                   kExecMagic = 0x47455845u;
constexpr size_t kStaticShared = 48u << 10;   // static __shared__ per block, as nvcc allows
constexpr size_t kDefaultDynamic = 48u << 10; // dynamic shared memory without cudaFuncSetAttribute
constexpr size_t kMaxDynamic = 227u << 10;    // sm_90's opt-in limit per block
constexpr int kMaxThreads = 1024;

size_t env_size(const char *name, size_t dflt)
{
    const char *s = getenv(name);
    if (s == nullptr || *s == 0) return dflt;
    char *end = nullptr;
    double v = strtod(s, &end);
    if (end == s || v < 0) return dflt;
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1024.0 * 1024.0; break;
    case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; break;
    default: break;
    }
    return (size_t)v;
}

double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

thread_local cudaError_t tl_last_error = cudaSuccess;

void set_error(cudaError_t e)
{
    if (e != cudaSuccess) tl_last_error = e;
}

cudaError_t ret(cudaError_t e)
{
    set_error(e);
    return e;
}

// ---------------------------------------------------------------- fibers and blocks

struct warp_t {
    int arrived;
    unsigned gen;
    unsigned alive_mask; // lanes of this warp that exist and have not exited
    unsigned cur_mask;   // the mask of the operation lanes are gathering for
    unsigned long long slots[2][32];
};

struct fiber_t {
    ucontext_t ctx;
    char *stack; // mmap'ed: a guard page, then stack_size bytes
    thread_state ts;
    bool done;
    void *asan_fake;
};

struct block_t {
    ucontext_t main_ctx;
    std::unique_ptr<fiber_t[]> fibers{new fiber_t[kMaxThreads]()};
    size_t stack_size = 0;
    int n = 0, cur = 0, alive = 0;
    int bar_arrived = 0, bar_count[2] = {0, 0};
    unsigned bar_gen = 0;
    warp_t warps[kMaxThreads / 32];
    long stall = 0;
    bool failed = false;
    char why[512] = ""; // fixed storage: a failing fiber's stack is abandoned, never unwound
    // shared memory of the running block
    alignas(64) unsigned char static_mem[kStaticShared];
    size_t static_used = 0;
    struct key_t {
        const void *key;
        size_t off;
    } keys[64];
    int nkeys = 0;
    std::vector<unsigned char> dyn = std::vector<unsigned char>(kMaxDynamic + 64);
    body_fn body = nullptr;
    void *ctx = nullptr;
    const void *main_bottom = nullptr;
    size_t main_size = 0;

    ~block_t()
    {
        for (int i = 0; i < kMaxThreads; i++)
            if (fibers[i].stack) {
#ifdef KVP_EMU_ASAN
                /* ASan keeps the redzones of the frames a fiber left on its stack (an abandoned fiber's, say)
                 * past munmap: a later mapping at the same address (a model file) would read as a stack
                 * overflow. This OS thread's fibers end here. */
                __asan_unpoison_memory_region(fibers[i].stack + getpagesize(), stack_size);
#endif
                munmap(fibers[i].stack, stack_size + (size_t)getpagesize());
            }
    }
};

thread_local block_t *tl_blk = nullptr;

block_t *this_block()
{
    static thread_local std::unique_ptr<block_t> b;
    if (!b) b.reset(new block_t());
    return b.get();
}

// Switches from fiber (or main, from == nullptr) to fiber `to` (or main, to == nullptr). dying: the current
// fiber never runs again.
void switch_ctx(block_t *b, ucontext_t *from, void **from_fake, ucontext_t *to, const void *to_bottom,
                size_t to_size, bool dying)
{
#ifdef KVP_EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : from_fake, to_bottom, to_size);
#else
    (void)from_fake, (void)to_bottom, (void)to_size;
#endif
    if (dying) {
        setcontext(to);
        abort(); // setcontext does not return
    }
    swapcontext(from, to);
#ifdef KVP_EMU_ASAN
    __sanitizer_finish_switch_fiber(*from_fake, nullptr, nullptr);
#endif
    (void)b;
}

void to_fiber(block_t *b, int i, bool dying)
{
    fiber_t *from = &b->fibers[b->cur], *to = &b->fibers[i];
    b->cur = i;
    tl_thread = &to->ts;
    switch_ctx(b, &from->ctx, &from->asan_fake, &to->ctx, to->stack + getpagesize(), b->stack_size, dying);
}

[[noreturn]] void to_main(block_t *b)
{
    switch_ctx(b, nullptr, nullptr, &b->main_ctx, b->main_bottom, b->main_size, true);
    abort();
}

[[noreturn]] void fail(block_t *b, const char *why)
{
    if (!b->failed) b->failed = true, snprintf(b->why, sizeof b->why, "%s", why);
    to_main(b);
}

// Resumes the next live fiber after the current one (round robin); back here when this one is resumed.
void yield(block_t *b)
{
    int i = b->cur;
    do i = (i + 1) % b->n;
    while (b->fibers[i].done);
    if (i == b->cur) fail(b, "deadlock: the only live thread waits for threads that exited or never come");
    to_fiber(b, i, false);
    if (b->failed) to_main(b);
}

// One more resume of a waiting fiber that found its condition unmet; a full round of such resumes by every
// live fiber, with nobody getting through, is a deadlock.
void wait_step(block_t *b, const char *what)
{
    if (++b->stall > 2L * b->alive + 4) {
        char msg[384];
        snprintf(msg, sizeof msg,
                 "deadlock: every live thread waits (last at %s): a barrier in a branch some threads skip, or lanes "
                 "of a warp waiting at different points", what);
        fail(b, msg);
    }
    yield(b);
}

void release_block_barrier(block_t *b)
{
    b->bar_arrived = 0;
    b->bar_count[(b->bar_gen + 1) & 1] = 0;
    b->bar_gen++;
    b->stall = 0;
}

void release_warp(block_t *b, warp_t &w)
{
    w.arrived = 0;
    w.gen++;
    b->stall = 0;
}

void fiber_entry()
{
    block_t *b = tl_blk;
#ifdef KVP_EMU_ASAN
    const void *bottom = nullptr;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
    if (b->main_bottom == nullptr) b->main_bottom = bottom, b->main_size = size;
#endif
    b->body(b->ctx);
    // exit: this thread counts as arrived at every barrier from now on
    fiber_t *f = &b->fibers[b->cur];
    f->done = true;
    b->alive--;
    warp_t &w = b->warps[f->ts.linear >> 5];
    w.alive_mask &= ~(1u << (f->ts.linear & 31));
    if (b->bar_arrived > 0 && b->bar_arrived >= b->alive) release_block_barrier(b);
    if (w.arrived > 0 && w.arrived >= __builtin_popcount(w.cur_mask & w.alive_mask)) release_warp(b, w);
    b->stall = 0;
    if (b->alive == 0) to_main(b);
    int i = b->cur;
    do i = (i + 1) % b->n;
    while (b->fibers[i].done);
    to_fiber(b, i, true);
}

struct grid_job {
    const char *name;
    body_fn body;
    void *ctx;
    dim3 grid, block;
    size_t shmem;
    long total;
    std::atomic<long> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::string why;
};

__attribute__((noinline)) size_t g_stack_size()
{
    static size_t s = [] {
        size_t v = env_size("KVPAGE_EMU_STACK", 64u << 10);
        size_t pg = (size_t)getpagesize();
        if (v < (64u << 10)) v = 64u << 10;
        return (v + pg - 1) / pg * pg;
    }();
    return s;
}

// Sets up block `idx` of the job on this OS thread's fibers (false: no stacks).
__attribute__((noinline)) bool prepare_block(grid_job &j, long idx)
{
    block_t *b = this_block();
    tl_blk = b;
    const int n = (int)(j.block.x * j.block.y * j.block.z);
    if (b->stack_size == 0) b->stack_size = g_stack_size();
    const size_t pg = (size_t)getpagesize();
    for (int i = 0; i < n; i++) {
        fiber_t &f = b->fibers[i];
        if (f.stack == nullptr) {
            void *m = mmap(nullptr, b->stack_size + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
            if (m == MAP_FAILED) {
                std::lock_guard<std::mutex> g(j.mu);
                j.why = "cannot map fiber stacks";
                return false;
            }
            mprotect(m, pg, PROT_NONE); // guard page below the stack
            f.stack = static_cast<char *>(m);
        }
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack + pg;
        f.ctx.uc_stack.ss_size = b->stack_size;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_entry, 0);
        f.done = false;
        f.asan_fake = nullptr;
        f.ts.linear = i;
        f.ts.tid.x = (unsigned)i % j.block.x;
        f.ts.tid.y = (unsigned)(i / j.block.x) % j.block.y;
        f.ts.tid.z = (unsigned)(i / (j.block.x * j.block.y));
    }
    for (int w = 0; w * 32 < n; w++) {
        warp_t &wp = b->warps[w];
        const int lanes = n - w * 32 < 32 ? n - w * 32 : 32;
        wp.arrived = 0;
        wp.gen = 0;
        wp.alive_mask = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
        wp.cur_mask = 0;
    }
    b->n = n;
    b->alive = n;
    b->cur = 0;
    b->bar_arrived = 0;
    b->bar_count[0] = b->bar_count[1] = 0;
    b->bar_gen = 0;
    b->stall = 0;
    b->failed = false;
    b->why[0] = 0;
    b->static_used = 0;
    b->nkeys = 0;
    if (j.shmem) std::memset(b->dyn.data(), 0xff, j.shmem);
    b->body = j.body;
    b->ctx = j.ctx;
    tl_block_idx.x = (unsigned)(idx % j.grid.x);
    tl_block_idx.y = (unsigned)(idx / j.grid.x % j.grid.y);
    tl_block_idx.z = (unsigned)(idx / ((long)j.grid.x * j.grid.y));
    tl_block_dim = j.block;
    tl_grid_dim = j.grid;
    tl_thread = &b->fibers[0].ts;
    return true;
}

// Runs block `idx` of the job on this OS thread. Returns false (and records why) when it failed.
bool run_block(grid_job &j, long idx)
{
    if (!prepare_block(j, idx)) return false;
    block_t *b = tl_blk;
    void *fake = nullptr;
#ifdef KVP_EMU_ASAN
    __sanitizer_start_switch_fiber(&fake, b->fibers[0].stack + getpagesize(), b->stack_size);
#endif
    swapcontext(&b->main_ctx, &b->fibers[0].ctx);
#ifdef KVP_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    (void)fake;
    tl_thread = nullptr;
    tl_blk = nullptr;
    if (b->failed) {
        std::lock_guard<std::mutex> g(j.mu);
        if (j.why.empty())
            j.why = std::string(b->why) + " (block " + std::to_string(tl_block_idx.x) + "," +
                    std::to_string(tl_block_idx.y) + "," + std::to_string(tl_block_idx.z) + ")";
        return false;
    }
    return true;
}

void run_blocks(grid_job &j)
{
    for (;;) {
        if (j.failed.load(std::memory_order_relaxed)) return;
        long i = j.next.fetch_add(1);
        if (i >= j.total) return;
        if (!run_block(j, i)) j.failed = true;
    }
}

// A pool of worker threads; the launching thread works too. Reset in a forked child (the threads are gone).
struct pool_t {
    std::mutex mu;
    std::condition_variable cv, done_cv;
    grid_job *job = nullptr;
    unsigned long gen = 0;
    int busy = 0, workers = -1;
};

pool_t *g_pool = new pool_t(); // never destroyed: workers may still wait on it at exit
std::mutex g_launch_mu;        // one grid at a time (launches are synchronous anyway)

void worker_main(unsigned long seen)
{
    for (;;) {
        grid_job *j;
        {
            std::unique_lock<std::mutex> lk(g_pool->mu);
            g_pool->cv.wait(lk, [&] { return g_pool->gen != seen; });
            seen = g_pool->gen;
            j = g_pool->job;
        }
        run_blocks(*j);
        std::lock_guard<std::mutex> lk(g_pool->mu);
        if (--g_pool->busy == 0) g_pool->done_cv.notify_all();
    }
}

void atfork_child()
{
    g_pool = new pool_t(); // the parent's workers do not exist here
    new (&g_launch_mu) std::mutex();
}

int emu_threads()
{
    static int n = [] {
        long hw = sysconf(_SC_NPROCESSORS_ONLN);
        long v = (long)env_size("KVPAGE_EMU_THREADS", (size_t)(hw < 1 ? 1 : hw > 4 ? 4 : hw));
        pthread_atfork(nullptr, nullptr, atfork_child);
        return (int)(v < 1 ? 1 : v > 64 ? 64 : v);
    }();
    return n;
}

void run_grid(grid_job &j)
{
    const int nt = emu_threads();
    if (nt == 1 || j.total == 1) {
        run_blocks(j);
        return;
    }
    pool_t *p = g_pool;
    {
        std::lock_guard<std::mutex> lk(p->mu);
        if (p->workers < 0) {
            p->workers = nt - 1;
            for (int i = 0; i < p->workers; i++) std::thread(worker_main, p->gen).detach();
        }
        p->job = &j;
        p->busy = p->workers;
        p->gen++;
    }
    p->cv.notify_all();
    run_blocks(j);
    std::unique_lock<std::mutex> lk(p->mu);
    p->done_cv.wait(lk, [&] { return p->busy == 0; });
}

// ---------------------------------------------------------------- memory bookkeeping

struct mem_t {
    std::mutex mu;
    std::map<uintptr_t, size_t> dev;  // device allocations: start -> bytes
    std::set<uintptr_t> host;         // pinned host allocations
    std::set<const void *> streams, events, graphs, execs;
    std::map<const void *, int> max_dyn; // cudaFuncAttributeMaxDynamicSharedMemorySize per kernel
    size_t used = 0;
};

mem_t &mem()
{
    static mem_t *m = new mem_t();
    return *m;
}

size_t total_mem()
{
    static size_t t = env_size("KVPAGE_EMU_DEVICE_MEM", (size_t)8 << 30);
    return t;
}

// Whether [p, p+n) lies inside one device allocation (lock held).
bool in_device(const void *p, size_t n)
{
    auto &m = mem();
    uintptr_t a = (uintptr_t)p;
    auto it = m.dev.upper_bound(a);
    if (it == m.dev.begin()) return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
}

bool is_legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy; }

std::atomic<int> g_captures{0}; // streams capturing now (a quick test before the lock)

// A registered stream, or nullptr (lock held).
CUstream_st *find_stream(cudaStream_t s)
{
    if (is_legacy(s) || s == cudaStreamPerThread) return nullptr;
    return mem().streams.count(s) ? s : nullptr;
}

// A "potentially unsafe" call (a synchronous copy or memset, cudaDeviceSynchronize, cudaFree): while a capture
// begun in Global mode (any thread) or in ThreadLocal mode (this thread) is open, CUDA refuses it and
// invalidates that capture.
cudaError_t unsafe_call()
{
    if (g_captures.load() == 0) return cudaSuccess;
    std::lock_guard<std::mutex> g(mem().mu);
    bool hit = false;
    for (const void *p : mem().streams) {
        CUstream_st *s = const_cast<CUstream_st *>(static_cast<const CUstream_st *>(p));
        if (s->cap == cudaStreamCaptureStatusNone) continue;
        if (s->mode == cudaStreamCaptureModeGlobal ||
            (s->mode == cudaStreamCaptureModeThreadLocal && s->thread == std::this_thread::get_id())) {
            s->cap = cudaStreamCaptureStatusInvalidated;
            hit = true;
        }
    }
    return hit ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

// Work on the legacy stream, which would wait for every blocking stream: refused while one of them captures
// (and that capture is invalidated).
cudaError_t legacy_call(cudaStream_t st)
{
    if (!is_legacy(st) || g_captures.load() == 0) return cudaSuccess;
    std::lock_guard<std::mutex> g(mem().mu);
    bool hit = false;
    for (const void *p : mem().streams) {
        CUstream_st *s = const_cast<CUstream_st *>(static_cast<const CUstream_st *>(p));
        if (s->cap == cudaStreamCaptureStatusNone || (s->flags & cudaStreamNonBlocking)) continue;
        s->cap = cudaStreamCaptureStatusInvalidated;
        hit = true;
    }
    return hit ? cudaErrorStreamCaptureImplicit : cudaSuccess;
}

// Records node nd on stream st when st is capturing (true; *out: the call's result), else false (run it now).
// check: the call's own validation; a failed one invalidates the capture, as on CUDA.
bool record_node(cudaStream_t st, node_t &&nd, cudaError_t check, cudaError_t *out)
{
    if (g_captures.load() == 0) return false;
    std::lock_guard<std::mutex> g(mem().mu);
    CUstream_st *s = find_stream(st);
    if (s == nullptr || s->cap == cudaStreamCaptureStatusNone) return false;
    if (s->cap == cudaStreamCaptureStatusInvalidated) *out = cudaErrorStreamCaptureInvalidated;
    else if (check != cudaSuccess) {
        s->cap = cudaStreamCaptureStatusInvalidated;
        *out = check;
    } else {
        if (nd.kind == NODE_EVENT) nd.event->captured = true;
        s->nodes.push_back(std::move(nd));
        *out = cudaSuccess;
    }
    return true;
}

bool stream_ok(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
    std::lock_guard<std::mutex> g(mem().mu);
    return mem().streams.count(s) != 0;
}

bool event_ok(cudaEvent_t e)
{
    if (e == nullptr) return false;
    std::lock_guard<std::mutex> g(mem().mu);
    return mem().events.count(e) != 0;
}

} // namespace

// ---------------------------------------------------------------- device-side entry points

void sync_block()
{
    (void)sync_block_count(0);
}

int sync_block_count(int pred)
{
    block_t *b = tl_blk;
    const unsigned g = b->bar_gen;
    const int par = (int)(g & 1);
    b->bar_count[par] += pred != 0;
    if (++b->bar_arrived >= b->alive) release_block_barrier(b);
    else
        while (b->bar_gen == g) wait_step(b, "__syncthreads");
    b->stall = 0;
    return b->bar_count[par];
}

int lane_id() { return tl_thread->linear & 31; }

unsigned long long warp_exchange(unsigned mask, unsigned long long bits, int src, unsigned *ballot)
{
    block_t *b = tl_blk;
    const int lin = tl_thread->linear, lane = lin & 31;
    warp_t &w = b->warps[lin >> 5];
    const unsigned g = w.gen;
    const int par = (int)(g & 1);
    if (!((mask >> lane) & 1u)) fail(b, "a warp operation's mask leaves out the calling lane");
    if (w.arrived == 0) w.cur_mask = mask;
    else if (w.cur_mask != mask)
        fail(b, "lanes of one warp meet at a warp operation with different masks (not emulated)");
    w.slots[par][lane] = bits;
    const unsigned part = mask & w.alive_mask;
    if (++w.arrived >= __builtin_popcount(part)) release_warp(b, w);
    else
        while (w.gen == g) wait_step(b, "a warp shuffle, vote or __syncwarp");
    b->stall = 0;
    if (ballot) {
        unsigned r = 0;
        for (int l = 0; l < 32; l++)
            if (((part >> l) & 1u) && w.slots[par][l]) r |= 1u << l;
        *ballot = r;
        return 0;
    }
    if (src < 0 || src > 31 || !((part >> src) & 1u)) return bits; // undefined on a GPU: own value
    return w.slots[par][src];
}

void sync_warp(unsigned mask) { (void)warp_exchange(mask, 0, -1, nullptr); }

void trap(const char *why)
{
    if (tl_blk == nullptr) {
        fprintf(stderr, "kvpage CUDA emulator: %s outside a kernel\n", why);
        abort();
    }
    fail(tl_blk, why);
}

void *shared_static(const void *key, size_t bytes, size_t align)
{
    block_t *b = tl_blk;
    for (int i = 0; i < b->nkeys; i++)
        if (b->keys[i].key == key) return b->static_mem + b->keys[i].off;
    size_t off = (b->static_used + align - 1) / align * align;
    if (off + bytes > kStaticShared || b->nkeys == 64)
        fail(b, "static shared memory over 48 KiB (or over 64 arrays) in one block");
    b->keys[b->nkeys++] = {key, off};
    b->static_used = off + bytes;
    std::memset(b->static_mem + off, 0xff, bytes); // poison: a read before a write sees NaN / -1
    return b->static_mem + off;
}

void *shared_dynamic()
{
    return tl_blk->dyn.data();
}

namespace {

// The launch's configuration as CUDA checks it.
cudaError_t check_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream)
{
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > (unsigned)kMaxThreads || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
        return cudaErrorInvalidConfiguration;
    size_t limit = kDefaultDynamic;
    {
        std::lock_guard<std::mutex> g(mem().mu);
        auto it = mem().max_dyn.find(func);
        if (it != mem().max_dyn.end()) limit = (size_t)it->second;
    }
    if (shmem > limit) return cudaErrorInvalidValue;
    if (!stream_ok(stream)) return cudaErrorInvalidResourceHandle;
    if (tl_blk != nullptr) {
        fprintf(stderr, "kvpage CUDA emulator: kernel %s launched from device code (not emulated)\n", name);
        return cudaErrorNotSupported;
    }
    return cudaSuccess;
}

// Runs a checked launch to completion; cudaErrorLaunchFailure (and a message) when a block failed.
cudaError_t run_launch(const char *name, dim3 grid, dim3 block, size_t shmem, body_fn body, void *ctx)
{
    grid_job j;
    j.name = name;
    j.body = body;
    j.ctx = ctx;
    j.grid = grid;
    j.block = block;
    j.shmem = shmem;
    j.total = (long)grid.x * grid.y * grid.z;
    {
        std::lock_guard<std::mutex> g(g_launch_mu);
        run_grid(j);
    }
    if (j.failed) {
        fprintf(stderr, "kvpage CUDA emulator: kernel %s failed: %s\n", name, j.why.c_str());
        return cudaErrorLaunchFailure;
    }
    return cudaSuccess;
}

} // namespace

void launch(const char *name, const void *func, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
            body_fn body, void *ctx)
{
    cudaError_t e = check_launch(name, func, grid, block, shmem, stream);
    if (e == cudaSuccess) e = legacy_call(stream);
    if (e == cudaSuccess) e = run_launch(name, grid, block, shmem, body, ctx);
    set_error(e);
}

bool capturing(cudaStream_t stream)
{
    if (g_captures.load() == 0) return false;
    std::lock_guard<std::mutex> g(mem().mu);
    CUstream_st *s = find_stream(stream);
    return s != nullptr && s->cap != cudaStreamCaptureStatusNone;
}

void record_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                   body_fn body, void *ctx, void (*free_ctx)(void *))
{
    node_t nd;
    nd.kind = NODE_KERNEL;
    nd.name = name;
    nd.func = func;
    nd.grid = grid;
    nd.block = block;
    nd.shmem = shmem;
    nd.body = body;
    nd.ctx = std::shared_ptr<void>(ctx, free_ctx);
    const cudaError_t check = check_launch(name, func, grid, block, shmem, stream);
    cudaError_t e;
    if (record_node(stream, node_t(nd), check, &e)) set_error(e);
    else launch(name, func, grid, block, shmem, stream, body, ctx); // the capture ended meanwhile
}

} // namespace kvp_emu

// ---------------------------------------------------------------- the runtime API (cuda_runtime_api.h)

using namespace kvp_emu;

extern "C" {

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tl_last_error;
    tl_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return tl_last_error; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulator: see stderr)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureWrongThread:
        return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    default: return "unknown error";
    }
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (count == nullptr) return ret(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice); }

cudaError_t cudaGetDevice(int *device)
{
    if (device == nullptr) return ret(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = unsafe_call();
    if (e == cudaSuccess) e = legacy_call(nullptr);
    return ret(e);
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (v == nullptr) return ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (v == nullptr) return ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (p == nullptr) return ret(cudaErrorInvalidValue);
    if (device != 0) return ret(cudaErrorInvalidDevice);
    std::memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "kvpage CUDA emulator (%d host threads)", emu_threads());
    p->totalGlobalMem = total_mem();
    p->sharedMemPerBlock = 48u << 10;
    p->sharedMemPerBlockOptin = 227u << 10;
    p->sharedMemPerMultiprocessor = 228u << 10;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = emu_threads();
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 64;
    p->unifiedAddressing = 1;
    p->concurrentKernels = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (value == nullptr) return ret(cudaErrorInvalidValue);
    if (device != 0) return ret(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = emu_threads(); break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 << 10; break;
    case cudaDevAttrL2CacheSize: *value = 50 << 20; break;
    default: return ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (func == nullptr) return ret(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > (227u << 10)) return ret(cudaErrorInvalidValue);
        std::lock_guard<std::mutex> g(mem().mu);
        mem().max_dyn[func] = value;
    }
    return cudaSuccess; // other attributes: nothing to emulate
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    if (p == nullptr) return ret(cudaErrorInvalidValue);
    const size_t bytes = (n + 255) / 256 * 256 + 256;
    auto &m = mem();
    std::lock_guard<std::mutex> g(m.mu);
    if (m.used + bytes > total_mem()) return ret(cudaErrorMemoryAllocation);
    void *q = aligned_alloc(256, bytes);
    if (q == nullptr) return ret(cudaErrorMemoryAllocation);
    m.dev[(uintptr_t)q] = n ? n : 1;
    m.used += bytes;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (p == nullptr) return cudaSuccess;
    if (cudaError_t e = unsafe_call()) return ret(e); // cudaFree synchronizes the device
    auto &m = mem();
    std::lock_guard<std::mutex> g(m.mu);
    auto it = m.dev.find((uintptr_t)p);
    if (it == m.dev.end()) return ret(cudaErrorInvalidValue);
    m.used -= (it->second + 255) / 256 * 256 + 256;
    m.dev.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    if (capturing(s)) {
        fprintf(stderr, "kvpage CUDA emulator: cudaMallocAsync during stream capture (memory nodes) is not emulated\n");
        return ret(cudaErrorNotSupported);
    }
    return cudaMalloc(p, n);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    if (capturing(s)) {
        fprintf(stderr, "kvpage CUDA emulator: cudaFreeAsync during stream capture (memory nodes) is not emulated\n");
        return ret(cudaErrorNotSupported);
    }
    return cudaFree(p);
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    if (free_b == nullptr || total == nullptr) return ret(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(mem().mu);
    *total = total_mem();
    *free_b = total_mem() - mem().used;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    if (p == nullptr) return ret(cudaErrorInvalidValue);
    void *q = aligned_alloc(4096, (n + 4095) / 4096 * 4096 + 4096);
    if (q == nullptr) return ret(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(mem().mu);
    mem().host.insert((uintptr_t)q);
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }

cudaError_t cudaFreeHost(void *p)
{
    if (p == nullptr) return cudaSuccess;
    if (cudaError_t e = unsafe_call()) return ret(e);
    std::lock_guard<std::mutex> g(mem().mu);
    if (mem().host.erase((uintptr_t)p) == 0) return ret(cudaErrorInvalidValue);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    if (a == nullptr) return ret(cudaErrorInvalidValue);
    std::memset(a, 0, sizeof *a);
    std::lock_guard<std::mutex> g(mem().mu);
    if (in_device(p, 1)) a->type = cudaMemoryTypeDevice, a->devicePointer = const_cast<void *>(p);
    else {
        auto it = mem().host.upper_bound((uintptr_t)p);
        bool pinned = it != mem().host.begin() && *std::prev(it) <= (uintptr_t)p;
        a->type = pinned ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
        a->hostPointer = const_cast<void *>(p);
    }
    return cudaSuccess;
}

static cudaError_t check_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    if (n == 0) return cudaSuccess;
    if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> g(mem().mu);
    switch (kind) {
    case cudaMemcpyHostToHost: return cudaSuccess;
    case cudaMemcpyHostToDevice: return in_device(dst, n) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return in_device(src, n) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return in_device(dst, n) && in_device(src, n) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
    default: return cudaErrorInvalidMemcpyDirection;
    }
}

static cudaError_t copy_now(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    cudaError_t e = check_copy(dst, src, n, kind);
    if (e != cudaSuccess) return e;
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}

static cudaError_t check_set(void *p, size_t n)
{
    if (n == 0) return cudaSuccess;
    std::lock_guard<std::mutex> g(mem().mu);
    return in_device(p, n) ? cudaSuccess : cudaErrorInvalidValue;
}

static cudaError_t set_now(void *p, int value, size_t n)
{
    cudaError_t e = check_set(p, n);
    if (e == cudaSuccess && n) std::memset(p, value, n);
    return e;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    cudaError_t e = unsafe_call();
    if (e == cudaSuccess) e = legacy_call(nullptr);
    if (e == cudaSuccess) e = copy_now(dst, src, n, kind);
    return ret(e);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    node_t nd;
    nd.kind = NODE_MEMCPY;
    nd.dst = dst, nd.src = src, nd.n = n, nd.copy_kind = kind;
    cudaError_t e;
    if (record_node(s, std::move(nd), check_copy(dst, src, n, kind), &e)) return ret(e);
    e = legacy_call(s);
    if (e == cudaSuccess) e = copy_now(dst, src, n, kind);
    return ret(e);
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         enum cudaMemcpyKind kind)
{
    if (width > dpitch || width > spitch) return ret(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = cudaMemcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s)
{
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    if (width > dpitch || width > spitch) return ret(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++) { // one copy (or copy node) a row
        cudaError_t e = cudaMemcpyAsync((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, s);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t n)
{
    cudaError_t e = unsafe_call();
    if (e == cudaSuccess) e = legacy_call(nullptr);
    if (e == cudaSuccess) e = set_now(p, value, n);
    return ret(e);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s)
{
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    node_t nd;
    nd.kind = NODE_MEMSET;
    nd.dst = p, nd.n = n, nd.value = value;
    cudaError_t e;
    if (record_node(s, std::move(nd), check_set(p, n), &e)) return ret(e);
    e = legacy_call(s);
    if (e == cudaSuccess) e = set_now(p, value, n);
    return ret(e);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    if (s == nullptr) return ret(cudaErrorInvalidValue);
    auto *q = new CUstream_st();
    q->magic = kStreamMagic;
    q->flags = flags;
    std::lock_guard<std::mutex> g(mem().mu);
    mem().streams.insert(q);
    *s = q;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::mutex> g(mem().mu);
    if (s == nullptr || mem().streams.erase(s) == 0) return ret(cudaErrorInvalidResourceHandle);
    if (s->cap != cudaStreamCaptureStatusNone) g_captures--; // the capture ends with its stream
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    if (g_captures.load() > 0) {
        std::lock_guard<std::mutex> g(mem().mu);
        CUstream_st *q = find_stream(s);
        if (q != nullptr && q->cap != cudaStreamCaptureStatusNone) { // its work is recorded, never run: any mode
            q->cap = cudaStreamCaptureStatusInvalidated;
            return ret(cudaErrorStreamCaptureUnsupported);
        }
    }
    return ret(legacy_call(s));
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    if (!stream_ok(s) || !event_ok(e)) return ret(cudaErrorInvalidResourceHandle);
    if (e->captured) { // a join into a capture from another stream: CUDA forks the capture; not emulated
        std::lock_guard<std::mutex> g(mem().mu);
        CUstream_st *q = find_stream(s);
        if (q == nullptr || q->cap == cudaStreamCaptureStatusNone) {
            fprintf(stderr, "kvpage CUDA emulator: a stream waits for an event recorded in a capture (fork/join across "
                            "streams is not emulated)\n");
            return ret(cudaErrorNotSupported);
        }
    }
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    if (e == nullptr) return ret(cudaErrorInvalidValue);
    auto *q = new CUevent_st{kEventMagic, false, 0.0, false};
    std::lock_guard<std::mutex> g(mem().mu);
    mem().events.insert(q);
    *e = q;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    std::lock_guard<std::mutex> g(mem().mu);
    if (e == nullptr || mem().events.erase(e) == 0) return ret(cudaErrorInvalidResourceHandle);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!event_ok(e) || !stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    node_t nd;
    nd.kind = NODE_EVENT;
    nd.event = e;
    cudaError_t err;
    if (record_node(s, std::move(nd), cudaSuccess, &err)) return ret(err);
    if ((err = legacy_call(s)) != cudaSuccess) return ret(err);
    e->recorded = true;
    e->captured = false;
    e->t = now_s();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!event_ok(e)) return ret(cudaErrorInvalidResourceHandle);
    return e->captured ? ret(cudaErrorCapturedEvent) : cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (ms == nullptr) return ret(cudaErrorInvalidValue);
    if (!event_ok(a) || !event_ok(b) || !a->recorded || !b->recorded) return ret(cudaErrorInvalidResourceHandle);
    if (a->captured || b->captured) return ret(cudaErrorCapturedEvent);
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}

// ---------------------------------------------------------------- stream capture and graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return ret(cudaErrorInvalidValue);
    if (is_legacy(s)) return ret(cudaErrorStreamCaptureUnsupported);
    if (s == cudaStreamPerThread) {
        fprintf(stderr, "kvpage CUDA emulator: capture on cudaStreamPerThread is not emulated (use a created stream)\n");
        return ret(cudaErrorNotSupported);
    }
    std::lock_guard<std::mutex> g(mem().mu);
    CUstream_st *q = find_stream(s);
    if (q == nullptr) return ret(cudaErrorInvalidResourceHandle);
    if (q->cap != cudaStreamCaptureStatusNone) return ret(cudaErrorIllegalState);
    q->cap = cudaStreamCaptureStatusActive;
    q->mode = mode;
    q->thread = std::this_thread::get_id();
    q->nodes.clear();
    g_captures++;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    if (status == nullptr) return ret(cudaErrorInvalidValue);
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> g(mem().mu);
    if (is_legacy(s)) { // the null stream while a blocking stream captures: an error, nothing invalidated
        for (const void *p : mem().streams) {
            const CUstream_st *q = static_cast<const CUstream_st *>(p);
            if (q->cap != cudaStreamCaptureStatusNone && !(q->flags & cudaStreamNonBlocking))
                return ret(cudaErrorStreamCaptureImplicit);
        }
        *status = cudaStreamCaptureStatusNone;
        return cudaSuccess;
    }
    CUstream_st *q = find_stream(s);
    *status = q ? q->cap : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    if (graph == nullptr) return ret(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(mem().mu);
    CUstream_st *q = find_stream(s);
    if (q == nullptr || q->cap == cudaStreamCaptureStatusNone) return ret(cudaErrorIllegalState);
    if (q->mode != cudaStreamCaptureModeRelaxed && q->thread != std::this_thread::get_id())
        return ret(cudaErrorStreamCaptureWrongThread);
    const bool invalid = q->cap == cudaStreamCaptureStatusInvalidated;
    q->cap = cudaStreamCaptureStatusNone;
    g_captures--;
    std::vector<node_t> nodes;
    nodes.swap(q->nodes);
    if (invalid) {
        *graph = nullptr;
        return ret(cudaErrorStreamCaptureInvalidated);
    }
    auto *gr = new CUgraph_st();
    gr->magic = kGraphMagic;
    gr->nodes = std::move(nodes);
    mem().graphs.insert(gr);
    *graph = gr;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    (void)flags; // upload, auto-free and device-launch flags change nothing here
    if (exec == nullptr) return ret(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(mem().mu);
    if (graph == nullptr || mem().graphs.count(graph) == 0) return ret(cudaErrorInvalidValue);
    auto *x = new CUgraphExec_st();
    x->magic = kExecMagic;
    x->nodes = graph->nodes; // kernel parameters shared, not copied: both are immutable
    mem().execs.insert(x);
    *exec = x;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    return cudaGraphInstantiate(exec, graph, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    std::vector<node_t> nodes;
    {
        std::lock_guard<std::mutex> g(mem().mu);
        if (exec == nullptr || mem().execs.count(exec) == 0) return ret(cudaErrorInvalidValue);
        nodes = exec->nodes; // the exec may be destroyed while it runs (from another thread)
    }
    if (!stream_ok(s)) return ret(cudaErrorInvalidResourceHandle);
    if (capturing(s)) { // a graph launched into a capture: its nodes join the capture, in order
        for (node_t &nd : nodes) {
            cudaError_t e;
            if (record_node(s, std::move(nd), cudaSuccess, &e) && e != cudaSuccess) return ret(e);
        }
        return cudaSuccess;
    }
    if (cudaError_t e = legacy_call(s)) return ret(e);
    for (const node_t &nd : nodes) {
        cudaError_t e = cudaSuccess;
        switch (nd.kind) {
        case NODE_KERNEL: e = run_launch(nd.name, nd.grid, nd.block, nd.shmem, nd.body, nd.ctx.get()); break;
        case NODE_MEMCPY: e = copy_now(nd.dst, nd.src, nd.n, nd.copy_kind); break;
        case NODE_MEMSET: e = set_now(nd.dst, nd.value, nd.n); break;
        case NODE_EVENT:
            if (event_ok(nd.event)) nd.event->recorded = true, nd.event->captured = false, nd.event->t = now_s();
            break;
        }
        if (e != cudaSuccess) return ret(e); // the later nodes do not run
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    std::lock_guard<std::mutex> g(mem().mu);
    if (exec == nullptr || mem().execs.erase(exec) == 0) return ret(cudaErrorInvalidValue);
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    std::lock_guard<std::mutex> g(mem().mu);
    if (graph == nullptr || mem().graphs.erase(graph) == 0) return ret(cudaErrorInvalidValue);
    delete graph;
    return cudaSuccess;
}

} // extern "C"
