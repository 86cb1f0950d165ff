// Rotary position embedding parameters, as read from a model's GGUF metadata.
#pragma once

#include "dspark-gguf.h"

#include <string>

struct dspark_rope {
    int   mode        = 0;        // 0 = normal (adjacent pairs, llama), GGML_ROPE_TYPE_NEOX (half split)
    int   n_rot       = 0;        // rotated dims per head
    float freq_base   = 10000.0f;
    float freq_scale  = 1.0f;     // 1 / scaling factor (linear and YaRN)
    float ext_factor  = 0.0f;     // YaRN extrapolation mix; 0 = off
    float attn_factor = 1.0f;     // YaRN magnitude correction passed to ggml_rope_ext
    float beta_fast   = 32.0f;
    float beta_slow   = 1.0f;
    int   n_ctx_orig  = 0;

    // Read "{arch}.rope.*" keys; n_rot_default is used when rope.dimension_count is absent.
    static dspark_rope from_gguf(const dspark_gguf & f, const std::string & arch, int mode, int n_rot_default,
                                 int n_ctx_train);
};
