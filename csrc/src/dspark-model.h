// A loaded model: its file, its weights on a device, and the architecture's view of them.
#pragma once

#include "dspark.h"
#include "dspark-weights.h"
#include "models/target.h"

#include <memory>
#include <string>

struct dflash_model;

struct dspark_model {
    std::string arch;
    std::unique_ptr<dspark_weights> weights;
    std::unique_ptr<target_model>   target;  // set for qwen3 / qwen2 / llama / qwen3moe / gemma4
    std::unique_ptr<dflash_model>   draft;   // set for dflash
    const dspark_model *            borrowed = nullptr;  // a draft's target (embeddings, head)
    std::vector<int32_t>            d2t;     // a reduced-vocab draft's absolute target ids
    std::string                     device_names;  // of weights->devices, comma-separated

    dspark_model();
    ~dspark_model();

    const dspark_gguf & file() const { return *weights->file; }
    const std::string & path() const { return weights->file->path; }
    ggml_backend_dev_t  device() const { return weights->dev; }  // the main one (embeddings, head)
    // Every device holding its weights, and those of the target it borrows from.
    std::vector<ggml_backend_dev_t> devices() const;
    // Per layer, the memory its KV cache goes in: that of the device holding the layer's weights.
    std::vector<ggml_backend_buffer_type_t> layer_buffer_types(int n_layer) const;
};

// Load a target model; throws dspark_error naming the file and the problem.
dspark_model * dspark_model_load_target(const std::string & path, const dspark_model_params & params);

// Load a DFlash / DSpark draft for a target (nullptr: a self-contained draft with its own
// embeddings and head). The target must outlive the draft. Throws on any mismatch.
dspark_model * dspark_model_load_draft(const std::string & path, const dspark_model * target,
                                       const dspark_model_params & params);
