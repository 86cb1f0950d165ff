// Attention on the CPU as one graph node: softmax(scale · q·kᵀ + mask) · v over a KV cache in host
// memory, for any number of queries (x86 with AVX2, FMA and F16C; elsewhere ggml's flash attention).
//
// Why not ggml's CPU flash attention: it has two kernels and picks by the batch. From 64 queries
// on, a tiled one (f32 throughout, 64 cells at a time); below, one that takes each query alone, with
// q rounded to f16 and one scalar exp per cell. So ggml's decode step does not compute what its
// prefill computes, and a 9-query verify converts every K and V value from f16 once per query.
//
// This node repeats the tiled kernel's arithmetic for every query (see dspark-attention.cpp): a
// prefill gives ggml's bits (llama.cpp's perplexity and KL divergence, exactly), and a decode step or
// a verify gives the same bits for its rows. The cells of a KV head are converted once per block of
// 64 for all the queries that read it. Each query is computed alone and in a fixed order (blocks
// aligned to multiples of 64, where the KV cache starts a sequence's cells), so its result depends
// neither on the other queries of its batch, nor on the cells of other sequences, nor on how threads
// share the work: decode and verify agree bit for bit, as greedy losslessness needs.
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
