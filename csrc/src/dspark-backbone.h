// The transformer dimensions every model GGUF declares under its architecture prefix (targets and
// drafts alike), read and checked once.
#pragma once

#include "dspark-gguf.h"
#include "dspark-rope.h"

#include <string>
#include <vector>

struct dspark_backbone {
    int   n_embd = 0, n_layer = 0, n_ctx_train = 0, n_ff = 0;
    int   n_head = 0, n_head_kv = 0, head_dim = 0;
    float rms_eps = 1e-6f;
    dspark_rope rope;

    // Per-layer values of keys that may be arrays (Gemma-4 gives global and sliding layers their own
    // KV head counts; double-wide MLPs widen some layers): a scalar key fills every layer.
    std::vector<int> n_head_kv_l, n_ff_l;

    int n_embd_kv() const { return head_dim * n_head_kv; }  // K (and V) width of one layer

    // "{arch}.embedding_length", "block_count", "context_length", "feed_forward_length", head
    // counts, key/value length (equal), RMSNorm epsilon and rope; throws naming the bad key. The
    // scalar n_head_kv / n_ff are layer 0's.
    static dspark_backbone from_gguf(const dspark_gguf & f, const std::string & arch, int rope_mode);
};
