#include "dspark-backbone.h"

#include "dspark-impl.h"

#include <cmath>
#include <cstdint>

dspark_backbone dspark_backbone::from_gguf(const dspark_gguf & f, const std::string & a, int rope_mode) {
    dspark_backbone b;
    // integers are int64 in GGUF: a huge value must not wrap into a plausible int
    auto in_range = [&](const std::string & key, int64_t v) {
        if (v < INT32_MIN || v > INT32_MAX) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "'" + a + key + "' = " + std::to_string(v) + " is out of range");
        }
        return (int) v;
    };
    auto dim = [&](const std::string & key) { return in_range(key, f.get_int(a + key)); };
    auto dim_or = [&](const std::string & key, int def) { return in_range(key, f.get_int(a + key, def)); };
    b.n_embd      = dim(".embedding_length");
    b.n_layer     = dim(".block_count");
    b.n_ctx_train = dim(".context_length");
    b.n_head      = dim(".attention.head_count");
    b.rms_eps     = (float) f.get_float(a + ".attention.layer_norm_rms_epsilon");
    if (b.n_embd <= 0 || b.n_layer <= 0 || b.n_layer > 4096 || b.n_head <= 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "embedding_length, block_count (at most 4096) and head_count must be positive");
    }
    b.n_ff_l      = f.get_int_per_layer(a + ".feed_forward_length", b.n_layer);
    b.n_head_kv_l = f.get_int_per_layer(a + ".attention.head_count_kv", b.n_layer, b.n_head);
    for (int il = 0; il < b.n_layer; ++il) {
        if (b.n_ff_l[il] <= 0 || b.n_head_kv_l[il] <= 0) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "feed_forward_length and head_count_kv must be positive (layer " + std::to_string(il) + ")");
        }
        if (b.n_head % b.n_head_kv_l[il] != 0) {
            f.fail(DSPARK_STATUS_BAD_FORMAT, "head_count must be a multiple of head_count_kv (layer " + std::to_string(il) + ")");
        }
    }
    b.n_ff      = b.n_ff_l[0];
    b.n_head_kv = b.n_head_kv_l[0];
    // ggml's RMSNorm asserts eps >= 0 at compute time (NaN fails it too): refuse it here
    if (!(b.rms_eps >= 0.0f) || !std::isfinite(b.rms_eps)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "'" + a + ".attention.layer_norm_rms_epsilon' = " + std::to_string(b.rms_eps) +
                                             ": must be a finite number >= 0");
    }
    b.head_dim = dim_or(".attention.key_length", b.n_embd / b.n_head);
    if (b.head_dim <= 0 || (int64_t) b.head_dim * b.n_head > (1 << 24)) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "'" + a + ".attention.key_length' must be positive, and key_length x head_count "
                                             "at most 16777216");
    }
    if (f.get_int(a + ".attention.value_length", b.head_dim) != b.head_dim) {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "key_length != value_length is not supported");
    }
    b.rope = dspark_rope::from_gguf(f, a, rope_mode, b.head_dim, b.n_ctx_train);
    if (b.rope.n_rot > b.head_dim || b.rope.n_rot % 2 != 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "rope.dimension_count must be even and at most key_length");
    }
    return b;
}
