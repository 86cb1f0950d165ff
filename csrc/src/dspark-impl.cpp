#include "dspark-impl.h"

#include "ggml.h"

#include <cstdio>
#include <mutex>
#include <vector>

static std::string vformat(const char * fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    const int n = vsnprintf(nullptr, 0, fmt, ap2);
    va_end(ap2);
    std::vector<char> buf(n > 0 ? n + 1 : 1);
    vsnprintf(buf.data(), buf.size(), fmt, ap);
    return std::string(buf.data(), n > 0 ? n : 0);
}

std::string dspark_format(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

void dspark_throw(int32_t status, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    throw dspark_error(status, s);
}

// ---- last error (per thread) ----------------------------------------------------------------

static thread_local std::string g_last_error;
static thread_local int32_t     g_last_status = DSPARK_STATUS_OK;
static thread_local std::string g_ggml_error;

void dspark_set_last_error(const std::string & msg, int32_t status) {
    g_last_error  = msg;
    g_last_status = status;
}
void dspark_clear_last_error() {
    g_last_error.clear();
    g_last_status = DSPARK_STATUS_OK;
}
const char * dspark_get_last_error() { return g_last_error.c_str(); }
int32_t      dspark_get_last_status() { return g_last_status; }

std::string dspark_take_ggml_error() {
    std::string s;
    s.swap(g_ggml_error);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
        s.pop_back();
    }
    return s;
}

// ---- logging --------------------------------------------------------------------------------

static std::mutex          g_log_mutex;
static dspark_log_callback g_log_cb   = nullptr;
static void *              g_log_data = nullptr;

static void emit(int32_t level, const char * text) {
    dspark_log_callback cb;
    void * data;
    {
        std::lock_guard<std::mutex> lock(g_log_mutex);
        cb   = g_log_cb;
        data = g_log_data;
    }
    if (cb) {
        cb(level, text, data);
    } else if (level >= DSPARK_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

void dspark_log(int32_t level, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    if (s.empty() || s.back() != '\n') {
        s += '\n';
    }
    emit(level, s.c_str());
}

// ggml reports file-format problems only through its log; keep the last error line so that the
// exception we raise can say why, and forward everything to our log.
static void ggml_log_hook(enum ggml_log_level level, const char * text, void * /*user_data*/) {
    int32_t lvl = DSPARK_LOG_LEVEL_DEBUG;
    switch (level) {
        case GGML_LOG_LEVEL_ERROR: lvl = DSPARK_LOG_LEVEL_ERROR; break;
        case GGML_LOG_LEVEL_WARN:  lvl = DSPARK_LOG_LEVEL_WARN;  break;
        case GGML_LOG_LEVEL_INFO:  lvl = DSPARK_LOG_LEVEL_INFO;  break;
        default: break;
    }
    if (lvl == DSPARK_LOG_LEVEL_ERROR) {
        g_ggml_error += text;
        // ggml errors are reported to the caller through exceptions; log them at debug level
        lvl = DSPARK_LOG_LEVEL_DEBUG;
    }
    emit(lvl, text);
}

void dspark_log_install_ggml_hook() {
    ggml_log_set(ggml_log_hook, nullptr);
}

void dspark_log_set(dspark_log_callback callback, void * user_data) {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_log_cb   = callback;
    g_log_data = user_data;
}
