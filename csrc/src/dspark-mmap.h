// A read-only memory map of a whole file (or, where mapping is unavailable, a copy in memory).
#pragma once

#include <cstddef>
#include <string>

struct dspark_mmap {
    void * addr = nullptr;
    size_t size = 0;

    explicit dspark_mmap(const std::string & path);  // throws dspark_error
    ~dspark_mmap();
    dspark_mmap(const dspark_mmap &) = delete;
    dspark_mmap & operator=(const dspark_mmap &) = delete;

  private:
    bool mapped = false;
};
