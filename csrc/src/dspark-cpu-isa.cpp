#include "dspark-cpu-isa.h"

#include <cstdlib>
#include <initializer_list>
#include <cstring>

// What the CPU has. GCC and Clang's __builtin_cpu_supports checks the CPUID bits and, for the
// AVX families, that the OS saves the registers (XGETBV).
static dspark_isa detected() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") &&
        __builtin_cpu_supports("fma")) {
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
    }
    return "?";
}

dspark_isa dspark_cpu_isa_in_use() {
    static const dspark_isa isa = [] {
        dspark_isa best = detected();
        const char * cap = getenv("DSPARK_CPU_ISA");
        for (dspark_isa i : {dspark_isa::scalar, dspark_isa::avx2, dspark_isa::avx512_vnni}) {
            if (cap && strcmp(cap, dspark_cpu_isa_name(i)) == 0 && i < best) {
                best = i;
            }
        }
        return best;
    }();
    return isa;
}
