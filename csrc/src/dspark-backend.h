// ggml backends and devices: loading dynamic backends, choosing a device, creating backends and
// setting their thread counts. Everything goes through ggml's registry, never a CPU shortcut, so
// whatever backends the linked ggml provides (CPU, CUDA, Vulkan, Metal) are usable.
#pragma once

#include "ggml-backend.h"

#include <string>

// Load dynamically built backends (GGML_BACKEND_DL) once; dir = "" means this library's folder.
void dspark_backends_load(const std::string & dir = "");

int32_t            dspark_device_count_all();
ggml_backend_dev_t dspark_device_get(int32_t index);   // nullptr if out of range
ggml_backend_dev_t dspark_device_pick(int32_t index);  // -1: first GPU, else CPU; throws if invalid
ggml_backend_dev_t dspark_device_cpu();                // throws if the build has no CPU backend
bool               dspark_device_is_cpu(ggml_backend_dev_t dev);

// Whose kernels a device runs, which decides how graphs lay out their batch-invariant products
// (dspark-matmul.h, dspark_graph::attention_in_order): the CPU's, ggml-vulkan's, ggml-cuda's or
// another backend's. DSPARK_DEVICE_RULES=cuda (or vulkan) makes the CPU answer so: the CPU then runs
// the graphs that device gets (attention in sequence order, the forms of the products; a CUDA
// device's matmul plans), which is how the tests check those graphs' math and ids without a GPU.
enum class dspark_device_rules { cpu, vulkan, cuda, other };
dspark_device_rules dspark_device_rules_of(ggml_backend_dev_t dev);  // dev null: a host buffer (cpu)

// Initialise a backend on a device; throws with the device name on failure.
ggml_backend_t dspark_backend_init(ggml_backend_dev_t dev);
void           dspark_backend_set_threads(ggml_backend_t backend, int n_threads);
// CPU backend: run ggml's reference kernels (row by row flash attention, no tiled matmul, no op
// fusion), whose per-row results do not depend on how many rows the batch has; no-op elsewhere.
void           dspark_backend_set_reference_kernels(ggml_backend_t backend, bool on);

// "ggml <version> (<commit>); backends: CPU [AVX2 ...], ...": the version and every backend with
// the features it reports (loads the backends first).
std::string dspark_backend_system_info();
