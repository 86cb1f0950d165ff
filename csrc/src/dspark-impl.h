// Errors and logging shared by every part of the core.
//
// Inside the core, problems are thrown as dspark_error (a status plus a message); the C API
// boundary (dspark.cpp) catches them, records the message as the thread's last error and returns
// the status. Nothing else crosses the boundary.
#pragma once

#include "dspark.h"

#include <cstdarg>
#include <stdexcept>
#include <string>

struct dspark_error : std::runtime_error {
    int32_t status;
    dspark_error(int32_t status, const std::string & msg) : std::runtime_error(msg), status(status) {}
};

std::string dspark_format(const char * fmt, ...) __attribute__((format(printf, 1, 2)));

// Throw helpers: DSPARK_THROW(DSPARK_STATUS_BAD_FORMAT, "%s: missing key %s", path, key)
[[noreturn]] void dspark_throw(int32_t status, const char * fmt, ...) __attribute__((format(printf, 2, 3)));

void         dspark_set_last_error(const std::string & msg, int32_t status = DSPARK_STATUS_INVALID_ARGUMENT);
void         dspark_clear_last_error();
const char * dspark_get_last_error();
int32_t      dspark_get_last_status();

// Most recent error text logged by ggml on this thread (e.g. why gguf_init_from_file failed).
std::string dspark_take_ggml_error();

void dspark_log(int32_t level, const char * fmt, ...) __attribute__((format(printf, 2, 3)));
void dspark_log_install_ggml_hook();

#define DSPARK_LOG_DEBUG(...) dspark_log(DSPARK_LOG_LEVEL_DEBUG, __VA_ARGS__)
#define DSPARK_LOG_INFO(...)  dspark_log(DSPARK_LOG_LEVEL_INFO,  __VA_ARGS__)
#define DSPARK_LOG_WARN(...)  dspark_log(DSPARK_LOG_LEVEL_WARN,  __VA_ARGS__)
#define DSPARK_LOG_ERROR(...) dspark_log(DSPARK_LOG_LEVEL_ERROR, __VA_ARGS__)
