#include "dspark-rpc.h"

#include "dspark-backend.h"
#include "dspark-impl.h"

#include "ggml.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#if !defined(_WIN32)
#    include <fcntl.h>
#    include <netdb.h>
#    include <poll.h>
#    include <sys/socket.h>
#    include <unistd.h>
#endif

// ---- endpoints ----------------------------------------------------------------------------------

struct rpc_endpoint {
    std::string host;
    int         port = 0;
};

static rpc_endpoint parse_endpoint(const std::string & endpoint) {
    const size_t colon = endpoint.rfind(':');
    rpc_endpoint ep;
    if (colon != std::string::npos && colon > 0) {
        ep.host = endpoint.substr(0, colon);
        const std::string port = endpoint.substr(colon + 1);
        char * end = nullptr;
        const long p = port.empty() ? 0 : strtol(port.c_str(), &end, 10);
        ep.port = end && *end == '\0' && p > 0 && p < 65536 ? (int) p : 0;
    }
    if (ep.host.empty() || ep.port == 0) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "RPC endpoint '%s' is not host:port (port 1 .. 65535)", endpoint.c_str());
    }
    return ep;
}

// A plain TCP connect with a timeout, so that an unreachable address is an error message of ours
// rather than ggml-rpc's abort, and a black-holed host does not block for the kernel's minutes.
static void check_reachable(const std::string & endpoint, const rpc_endpoint & ep, int timeout_ms) {
#if !defined(_WIN32)
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * res = nullptr;
    if (getaddrinfo(ep.host.c_str(), std::to_string(ep.port).c_str(), &hints, &res) != 0 || !res) {
        dspark_throw(DSPARK_STATUS_IO, "RPC server %s: cannot resolve host '%s'", endpoint.c_str(), ep.host.c_str());
    }
    std::string why = "no address";
    bool ok = false;
    for (addrinfo * a = res; a && !ok; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            pollfd pfd = { fd, POLLOUT, 0 };
            rc = poll(&pfd, 1, timeout_ms);
            int err = rc == 0 ? ETIMEDOUT : 0;
            socklen_t len = sizeof(err);
            if (rc > 0) {
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            }
            rc = err == 0 ? 0 : -1;
            errno = err;
        }
        ok = rc == 0;
        if (!ok) {
            why = strerror(errno);
        }
        close(fd);
    }
    freeaddrinfo(res);
    if (!ok) {
        dspark_throw(DSPARK_STATUS_IO, "cannot connect to the RPC server at %s: %s (is `dspark-ggml rpc-server` running there?)",
                     endpoint.c_str(), why.c_str());
    }
#else
    (void) endpoint;
    (void) ep;
    (void) timeout_ms;
#endif
}

static ggml_backend_reg_t rpc_reg() {
    dspark_backends_load();
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (!reg) {
        dspark_throw(DSPARK_STATUS_UNSUPPORTED, "this build of ggml has no RPC backend (build it with GGML_RPC=ON)");
    }
    return reg;
}

// ---- losing a server ------------------------------------------------------------------------------

static std::atomic<bool>       g_active{false};  // a server was added: calls run on workers
static std::mutex              g_mu;
static std::condition_variable g_cv;             // a call finished, or a server was lost
static std::atomic<uint64_t>   g_n_lost{0};     // changed under g_mu; read without it on every compute
static std::string             g_lost_why;
static thread_local bool       t_in_call = false;

bool dspark_device_is_rpc(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    return reg && strncmp(ggml_backend_reg_name(reg), "RPC", 3) == 0;
}

bool dspark_rpc_lost(const std::vector<ggml_backend_dev_t> & devices) {
    if (g_n_lost.load() == 0) {
        return false;  // the usual case, checked before every graph: no lock
    }
    for (ggml_backend_dev_t d : devices) {
        if (dspark_device_is_rpc(d)) {
            return true;
        }
    }
    return false;
}

void dspark_rpc_check_alive(const std::vector<ggml_backend_dev_t> & devices) {
    if (dspark_rpc_lost(devices)) {
        std::lock_guard<std::mutex> lock(g_mu);
        dspark_throw(DSPARK_STATUS_DEVICE_LOST, "the connection to an RPC server was lost (%s); what was placed on RPC devices "
                     "can no longer be used (free it; RPC devices work again in a new process)", g_lost_why.c_str());
    }
}

// "…/ggml-rpc.cpp:566: Remote RPC server crashed…\n" → "Remote RPC server crashed…"
static std::string abort_text(const char * message) {
    std::string s = message;
    const size_t at = s.find(": ");
    if (at != std::string::npos) {
        s = s.substr(at + 2);
    }
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
        s.pop_back();
    }
    return s;
}

static void on_ggml_abort(const char * message) {
    if (!strstr(message, "ggml-rpc")) {
        fprintf(stderr, "%s\n", message);  // what ggml prints itself; abort() follows
        return;
    }
    if (t_in_call) {
        // On the thread of a core call: unwind back to its boundary, which reports it.
        throw dspark_error(DSPARK_STATUS_IO, "RPC: " + abort_text(message));
    }
    // A dispatcher thread of ggml-rpc: its server is gone and this thread cannot go on. Report the
    // loss to whoever waits, and park the thread rather than let abort() end the process.
    {
        std::lock_guard<std::mutex> lock(g_mu);
        g_n_lost++;
        g_lost_why = abort_text(message);
    }
    g_cv.notify_all();
    DSPARK_LOG_ERROR("dspark: lost an RPC server: %s", abort_text(message).c_str());
    for (;;) {
        std::this_thread::sleep_for(std::chrono::hours(24));
    }
}

void dspark_rpc_install_abort_hook() {
    ggml_set_abort_callback(on_ggml_abort);
}

// ---- calls on workers ---------------------------------------------------------------------------

struct call_job {
    std::function<int32_t()> fn;
    int32_t     status = DSPARK_STATUS_OK;
    std::string error;
    int32_t     error_status = DSPARK_STATUS_OK;
    bool        done = false;
};

static int32_t run_here(const std::function<int32_t()> & fn) {
    const bool outer = t_in_call;
    t_in_call = true;
    const int32_t st = fn();
    t_in_call = outer;
    return st;
}

// Idle workers wait for a job of their own; a new worker is started when none is idle. Workers are
// detached and the pool is never destroyed: one may be stuck on a lost server until the process ends.
struct call_worker {
    std::shared_ptr<call_job> job;
    std::condition_variable   cv;
};

struct call_pool {
    std::mutex                 mu;
    std::vector<call_worker *> idle;

    void submit(const std::shared_ptr<call_job> & job) {
        std::unique_lock<std::mutex> lock(mu);
        if (!idle.empty()) {
            call_worker * w = idle.back();
            idle.pop_back();
            w->job = job;
            w->cv.notify_one();
            return;
        }
        call_worker * w = new call_worker();
        w->job = job;
        std::thread([this, w]() { work(w); }).detach();
    }

    void work(call_worker * w) {
        for (;;) {
            std::shared_ptr<call_job> job;
            {
                std::unique_lock<std::mutex> lock(mu);
                w->cv.wait(lock, [&]() { return w->job != nullptr; });
                job.swap(w->job);
            }
            const int32_t st = run_here(job->fn);
            {
                std::lock_guard<std::mutex> lock(g_mu);
                job->status = st;
                job->error = dspark_get_last_error();
                job->error_status = dspark_get_last_status();
                job->done = true;
            }
            g_cv.notify_all();
            std::lock_guard<std::mutex> lock(mu);
            idle.push_back(w);
        }
    }
};

int32_t dspark_run_call(const std::function<int32_t()> & call) {
    if (!g_active.load() || t_in_call) {
        return run_here(call);
    }
    static call_pool * pool = new call_pool();
    auto job = std::make_shared<call_job>();
    job->fn = call;
    std::unique_lock<std::mutex> lock(g_mu);
    const uint64_t lost_before = g_n_lost.load();
    lock.unlock();
    pool->submit(job);
    lock.lock();
    g_cv.wait(lock, [&]() { return job->done || g_n_lost != lost_before; });
    if (!job->done) {
        // A server was lost while this call ran. Give a call that does not need it a moment to
        // finish on its own; one still waiting then is waiting for the lost server.
        g_cv.wait_for(lock, std::chrono::seconds(1), [&]() { return job->done; });
    }
    if (!job->done) {
        const std::string why = g_lost_why;
        lock.unlock();
        dspark_set_last_error("the connection to an RPC server was lost during this call (" + why +
                                  "); what was placed on RPC devices can no longer be used",
                              DSPARK_STATUS_DEVICE_LOST);
        return DSPARK_STATUS_DEVICE_LOST;
    }
    dspark_set_last_error(job->error, job->error_status);
    return job->status;
}

// ---- servers --------------------------------------------------------------------------------------

int32_t dspark_rpc_connect(const std::string & endpoint) {
    static std::mutex                     mu;
    static std::map<std::string, int32_t> added;  // endpoint -> its device count
    std::lock_guard<std::mutex> lock(mu);
    auto it = added.find(endpoint);
    if (it != added.end()) {
        return it->second;
    }
    const rpc_endpoint ep = parse_endpoint(endpoint);
    ggml_backend_reg_t reg = rpc_reg();
    auto add = (ggml_backend_reg_t (*)(const char *)) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server");
    if (!add) {
        dspark_throw(DSPARK_STATUS_UNSUPPORTED, "this ggml's RPC backend cannot add servers");
    }
    check_reachable(endpoint, ep, 5000);
    ggml_backend_reg_t server = nullptr;
    try {
        server = add(endpoint.c_str());  // a failure inside throws (see on_ggml_abort)
    } catch (const dspark_error & e) {
        throw dspark_error(e.status, "the server at " + endpoint + " does not answer as an rpc-server of this "
                                     "ggml version would (" + e.what() + ")");
    }
    const int32_t n = server ? (int32_t) ggml_backend_reg_dev_count(server) : 0;
    if (n == 0) {
        dspark_throw(DSPARK_STATUS_IO, "the RPC server at %s offers no devices", endpoint.c_str());
    }
    ggml_backend_register(server);
    added[endpoint] = n;
    g_active = true;
    return n;
}

void dspark_rpc_run_server(const std::string & endpoint, const std::vector<ggml_backend_dev_t> & devices, int n_threads) {
    parse_endpoint(endpoint);
    ggml_backend_reg_t reg = rpc_reg();
    typedef void (*start_fn)(const char *, const char *, size_t, size_t, ggml_backend_dev_t *);
    auto start = (start_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_start_server");
    if (!start) {
        dspark_throw(DSPARK_STATUS_UNSUPPORTED, "this ggml's RPC backend cannot serve");
    }
    std::vector<ggml_backend_dev_t> devs = devices.empty() ? std::vector<ggml_backend_dev_t>{ dspark_device_cpu() } : devices;
    for (ggml_backend_dev_t d : devs) {
        if (dspark_device_is_rpc(d)) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "device %s is itself an RPC device; serve local devices only",
                         ggml_backend_dev_name(d));
        }
    }
    start(endpoint.c_str(), nullptr, (size_t) std::max(1, n_threads), devs.size(), devs.data());
    // It returns only when it could not start (it printed why).
    dspark_throw(DSPARK_STATUS_IO, "could not serve RPC at %s (see the message above; is the port in use?)", endpoint.c_str());
}
