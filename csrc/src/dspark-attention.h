// Attention on the CPU as one graph node: softmax(scale · q·kᵀ + mask) · v over a KV cache in host
// memory, for any number of queries (x86 with AVX2, FMA and F16C; elsewhere ggml's flash attention).
//
// Why not ggml's CPU flash attention: it runs each query on its own with one scalar exp per cell,
// converting every K and V value from f16 for each of them; a verify batch of 9 queries then costs
// 9 times one decode per cell, over half of a demo-pair verify at 400 cells of context. Here the
// cells of a KV head are converted once per block of 64 for all the queries that read the head,
// scored 8 at a time, and their weights taken with a vectorised exp.
//
// Each query is still computed alone and in a fixed order (cells in groups of 8 inside blocks
// aligned to multiples of 64, where the KV cache starts a sequence's cells; sums in a fixed tree),
// so a query's result does not depend on the other queries of its batch, on the cells of other
// sequences, nor on how threads share the work: decode and verify agree bit for bit, as greedy
// losslessness needs.
#pragma once

#include "ggml.h"

// Is the kernel in this build (AVX2, FMA and F16C at compile time)?
bool dspark_attention_cpu_available();

// Can dspark_attention_cpu run over these K / V views (permuted to [D, n_kv, Hkv]) and mask?
bool dspark_attention_cpu_supports(const ggml_tensor * k, const ggml_tensor * v, const ggml_tensor * mask);

// q [D, H, T] F32; k, v [D, n_kv, Hkv] views of the cache (F16 or F32); mask [n_kv, >= T] F16.
// Returns [D, H, T] F32, as ggml_flash_attn_ext does.
ggml_tensor * dspark_attention_cpu(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                   ggml_tensor * mask, float scale);
