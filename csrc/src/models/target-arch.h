// The registry of target architectures: one row per GGUF `general.architecture` a target may have,
// each implemented by one file, models/<name>.cpp, the way llama.cpp's src/models/<arch>.cpp are.
//
// A row says what is particular to the architecture: its hyperparameters and tensors (load), and
// its decoder layer (layer), plus an optional per-graph input its layers read (layer_inputs). The
// shared loader (models/target.cpp) and model graph (models/target-graph.cpp) do the rest: token
// embeddings, the layer loop, captured hidden states, the output norm and the lm head.
//
// Adding an architecture: write models/<name>.cpp defining its `target_arch_info`, add its value
// to `target_arch` below and its row to the table in models/target-arch.cpp.
#pragma once

#include <string>

struct dspark_graph;
struct dspark_weights;
struct ggml_tensor;
struct target_layer_io;
struct target_model;

enum class target_arch {
    LLAMA,
    QWEN2,
    QWEN3,
    QWEN3MOE,
    GEMMA3,
    GEMMA4,
};

struct target_arch_info {
    target_arch  arch;
    const char * name;       // GGUF general.architecture, also the prefix of its keys
    int          rope_mode;  // ggml rope mode of the backbone's rope: 0 (normal) or GGML_ROPE_TYPE_NEOX

    // Hyperparameters beyond the backbone's, then every layer's geometry and tensors (m.layers
    // is already sized; the embeddings and output are loaded).
    void (*load)(target_model & m, dspark_weights & w);

    // Optional (null: none): a per-graph input every layer reads, from the batch's tokens [T] and
    // their (scaled) embeddings x [E, T]; the layers find it as target_layer_io::layer_inp.
    ggml_tensor * (*layer_inputs)(const dspark_graph & g, const target_model & m, ggml_tensor * tokens, ggml_tensor * x);

    // One decoder layer: the residual stream x [E, T] entering layer il -> the one leaving it.
    ggml_tensor * (*layer)(const target_layer_io & c, int il, ggml_tensor * x);
};

// The row of a GGUF architecture name; null when it is not a target architecture.
const target_arch_info * dspark_target_arch_find(const std::string & name);
// The target architectures' names, comma-separated, for messages.
std::string dspark_target_arch_names();
// The draft architecture (models/dflash.cpp): "dflash".
bool dspark_is_draft_arch(const std::string & name);
