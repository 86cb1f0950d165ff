// Which vector instructions the CPU kernels may use, found at run time (a library built on one
// machine may run on another), as ggml's CPU variants choose theirs.
#pragma once

// The instruction sets our kernels dispatch on, best last.
enum class dspark_isa { scalar, avx2, avx512_vnni, amx_int8 };

// What this CPU runs: detected once (the instructions and the OS's consent to their registers; for
// AMX, AVX-512 VNNI and the tiles, which Linux grants a process on request).
// DSPARK_CPU_ISA=scalar|avx2|avx512_vnni|amx_int8 caps it, to force a lesser route on a machine that has more.
dspark_isa dspark_cpu_isa_in_use();

const char * dspark_cpu_isa_name(dspark_isa isa);

// Does the CPU also multiply bf16 on the tiles (AMX-BF16), with the tiles in use (the ISA in use
// is amx_int8, so DSPARK_CPU_ISA caps this too)?
bool dspark_cpu_has_amx_bf16();
