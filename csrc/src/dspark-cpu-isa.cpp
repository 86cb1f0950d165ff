#include "dspark-cpu-isa.h"

#include <cstdlib>
#include <initializer_list>
#include <cstring>

#if defined(__linux__) && defined(__x86_64__)
#    include <cpuid.h>
#    include <sys/syscall.h>
#    include <unistd.h>
#endif

#ifdef DSPARK_AMX_KERNELS
// CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25), read directly (compilers name these
// features differently in __builtin_cpu_supports, older ones not at all).
static bool cpu_has_amx_int8() {
#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 24 & 1) && (edx >> 25 & 1);
#else
    return false;
#endif
}

// ... and AMX-BF16 (EDX bit 22).
static bool cpu_has_amx_bf16_bit() {
#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 22 & 1);
#else
    return false;
#endif
}

// Linux keeps the AMX tile data out of a process's saved state until the process asks for it
// (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); the grant holds for all its threads.
static bool os_grants_amx_tiles() {
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}
#endif  // DSPARK_AMX_KERNELS

// What the CPU has. GCC and Clang's __builtin_cpu_supports checks the CPUID bits and, for the
// AVX families, that the OS saves the registers (XGETBV).
static dspark_isa detected() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") &&
        __builtin_cpu_supports("fma")) {
#    ifdef DSPARK_AMX_KERNELS
        if (cpu_has_amx_int8() && os_grants_amx_tiles()) {
            return dspark_isa::amx_int8;
        }
#    endif
        return dspark_isa::avx512_vnni;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        return dspark_isa::avx2;
    }
#endif
    return dspark_isa::scalar;
}

const char * dspark_cpu_isa_name(dspark_isa isa) {
    switch (isa) {
        case dspark_isa::scalar:      return "scalar";
        case dspark_isa::avx2:        return "avx2";
        case dspark_isa::avx512_vnni: return "avx512_vnni";
        case dspark_isa::amx_int8:    return "amx_int8";
    }
    return "?";
}

dspark_isa dspark_cpu_isa_in_use() {
    static const dspark_isa isa = [] {
        dspark_isa best = detected();
        const char * cap = getenv("DSPARK_CPU_ISA");
        for (dspark_isa i : {dspark_isa::scalar, dspark_isa::avx2, dspark_isa::avx512_vnni, dspark_isa::amx_int8}) {
            if (cap && strcmp(cap, dspark_cpu_isa_name(i)) == 0 && i < best) {
                best = i;
            }
        }
        return best;
    }();
    return isa;
}

bool dspark_cpu_has_amx_bf16() {
#ifdef DSPARK_AMX_KERNELS
    static const bool has = cpu_has_amx_bf16_bit();
    return has && dspark_cpu_isa_in_use() >= dspark_isa::amx_int8;
#else
    return false;
#endif
}
