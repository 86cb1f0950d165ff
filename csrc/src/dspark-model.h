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
    std::unique_ptr<target_model>   target;  // set for qwen3 / llama / qwen2
    std::unique_ptr<dflash_model>   draft;   // set for dflash

    dspark_model();
    ~dspark_model();

    const dspark_gguf & file() const { return *weights->file; }
    const std::string & path() const { return weights->file->path; }
    ggml_backend_dev_t  device() const { return weights->dev; }
};

// Load a target model; throws dspark_error naming the file and the problem.
dspark_model * dspark_model_load_target(const std::string & path, const dspark_model_params & params);
