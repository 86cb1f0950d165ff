#include "dspark-mmap.h"

#include "dspark-impl.h"

#include <cstdio>
#include <cstdlib>

#if !defined(_WIN32)
#    include <fcntl.h>
#    include <sys/mman.h>
#    include <sys/stat.h>
#    include <unistd.h>
#endif

dspark_mmap::dspark_mmap(const std::string & path) {
#if !defined(_WIN32)
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) {
        dspark_throw(DSPARK_STATUS_IO, "%s: cannot open file", path.c_str());
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        dspark_throw(DSPARK_STATUS_IO, "%s: cannot stat file", path.c_str());
    }
    size = (size_t) st.st_size;
    addr = size ? mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
    close(fd);
    if (size && addr == MAP_FAILED) {
        addr = nullptr;
        dspark_throw(DSPARK_STATUS_IO, "%s: mmap failed", path.c_str());
    }
    mapped = true;
#else
    FILE * f = fopen(path.c_str(), "rb");
    if (!f) {
        dspark_throw(DSPARK_STATUS_IO, "%s: cannot open file", path.c_str());
    }
    fseek(f, 0, SEEK_END);
    size = (size_t) ftell(f);
    fseek(f, 0, SEEK_SET);
    addr = malloc(size ? size : 1);
    const bool ok = addr && fread(addr, 1, size, f) == size;
    fclose(f);
    if (!ok) {
        free(addr);
        addr = nullptr;
        dspark_throw(DSPARK_STATUS_IO, "%s: cannot read file", path.c_str());
    }
#endif
}

dspark_mmap::~dspark_mmap() {
#if !defined(_WIN32)
    if (mapped && addr) {
        munmap(addr, size);
    }
#else
    free(addr);
#endif
}
