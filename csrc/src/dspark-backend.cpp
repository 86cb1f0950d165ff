#include "dspark-backend.h"

#include <cstring>

#include "dspark-impl.h"
#include "dspark-rpc.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#if !defined(_WIN32)
#    include <dlfcn.h>
#endif

static std::string library_dir() {
#if !defined(_WIN32)
    Dl_info info;
    if (dladdr((void *) &library_dir, &info) && info.dli_fname) {
        std::string p = info.dli_fname;
        const size_t slash = p.find_last_of('/');
        return slash == std::string::npos ? "." : p.substr(0, slash);
    }
#endif
    return ".";
}

// ggml-vulkan 0.25.3 reorders each graph for concurrency (its graph_optimize). With the target and
// the draft both on one Vulkan device (two backend contexts), the reordered draft graphs crash
// lavapipe inside FLASH_ATTN_EXT; with the reordering off they run and match the CPU. ggml has no
// API for it: a Vulkan device reads GGML_VK_DISABLE_GRAPH_OPTIMIZE once, when it is created
// (ggml_vk_get_device, on the first request for its buffer type or a backend). So the devices are
// created here, once, with the variable set, and the variable is removed right after: the process
// environment is as it was (the change is visible only while the library loads its backends, in
// dspark_backends_load's call_once). Creating every Vulkan device up front costs a Vulkan build a
// moment at load even when it runs on the CPU. A user who sets DSPARK_VK_GRAPH_OPTIMIZE=1 keeps
// ggml's reordering; one who sets GGML_VK_DISABLE_GRAPH_OPTIMIZE gets what ggml does with it.
static void set_env(const char * name, const char * value) {
#if defined(_WIN32)
    _putenv_s(name, value ? value : "");
#else
    if (value) {
        setenv(name, value, 1);
    } else {
        unsetenv(name);
    }
#endif
}

static void create_vulkan_devices() {
    const char * var = "GGML_VK_DISABLE_GRAPH_OPTIMIZE";
    if (getenv("DSPARK_VK_GRAPH_OPTIMIZE") || getenv(var)) {
        return;
    }
    std::vector<ggml_backend_dev_t> vulkan;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        if (reg && std::string(ggml_backend_reg_name(reg)) == "Vulkan") {
            vulkan.push_back(dev);
        }
    }
    if (vulkan.empty()) {
        return;
    }
    set_env(var, "1");
    for (ggml_backend_dev_t dev : vulkan) {
        ggml_backend_dev_buffer_type(dev);  // creates the device, which reads the variable
    }
    set_env(var, nullptr);
}

void dspark_backends_load(const std::string & dir) {
    static std::once_flag once;
    std::call_once(once, [&]() {
        dspark_log_install_ggml_hook();
        dspark_rpc_install_abort_hook();
#ifdef GGML_BACKEND_DL
        const std::string d = dir.empty() ? library_dir() : dir;
        ggml_backend_load_all_from_path(d.c_str());
#else
        (void) dir;
#endif
        create_vulkan_devices();
    });
}

int32_t dspark_device_count_all() {
    dspark_backends_load();
    return (int32_t) ggml_backend_dev_count();
}

ggml_backend_dev_t dspark_device_get(int32_t index) {
    if (index < 0 || index >= dspark_device_count_all()) {
        return nullptr;
    }
    return ggml_backend_dev_get((size_t) index);
}

bool dspark_device_is_cpu(ggml_backend_dev_t dev) {
    return ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
}

dspark_device_rules dspark_device_rules_of(ggml_backend_dev_t dev) {
    if (!dev || dspark_device_is_cpu(dev)) {
        // read each time (not cached): a test switches it around the contexts it makes
        const char * forced = getenv("DSPARK_DEVICE_RULES");
        const bool cuda = forced && strcmp(forced, "cuda") == 0, vulkan = forced && strcmp(forced, "vulkan") == 0;
        return cuda ? dspark_device_rules::cuda : vulkan ? dspark_device_rules::vulkan : dspark_device_rules::cpu;
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    const char * name = reg ? ggml_backend_reg_name(reg) : "";
    if (strcmp(name, "Vulkan") == 0) {
        return dspark_device_rules::vulkan;
    }
    return strcmp(name, "CUDA") == 0 ? dspark_device_rules::cuda : dspark_device_rules::other;
}

ggml_backend_dev_t dspark_device_cpu() {
    dspark_backends_load();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) {
        dspark_throw(DSPARK_STATUS_UNSUPPORTED, "this build of ggml has no CPU backend");
    }
    return dev;
}

ggml_backend_dev_t dspark_device_pick(int32_t index) {
    const int32_t n = dspark_device_count_all();
    if (index >= 0) {
        if (index >= n) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "device index %d out of range (%d devices)", index, n);
        }
        return ggml_backend_dev_get((size_t) index);
    }
    if (index != -1) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "device index %d: use -1 for automatic or 0..%d", index, n - 1);
    }
    for (int32_t i = 0; i < n; ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get((size_t) i);
        const auto type = ggml_backend_dev_type(dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            return dev;
        }
    }
    return dspark_device_cpu();
}

ggml_backend_t dspark_backend_init(ggml_backend_dev_t dev) {
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    if (!backend) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "failed to initialise backend on device %s", ggml_backend_dev_name(dev));
    }
    return backend;
}

void dspark_backend_set_reference_kernels(ggml_backend_t backend, bool on) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev && dspark_device_is_cpu(dev) ? ggml_backend_dev_backend_reg(dev) : nullptr;
    if (!reg) {
        return;
    }
    // looked up, not linked: the CPU backend may be a dynamically loaded module
    auto fn = (void (*)(ggml_backend_t, bool)) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cpu_set_use_ref");
    if (fn) {
        fn(backend, on);
    }
}

void dspark_backend_set_threads(ggml_backend_t backend, int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
    if (!reg) {
        return;
    }
    auto fn = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (fn) {
        fn(backend, n_threads);
    }
}

std::string dspark_backend_system_info() {
    dspark_backends_load();
    std::string s = "ggml " + std::string(ggml_version()) + " (" + ggml_commit() + ")";
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        ggml_backend_reg_t reg = ggml_backend_reg_get(i);
        s += std::string(i ? ", " : "; backends: ") + ggml_backend_reg_name(reg);
        auto get_features = (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
        if (get_features) {
            std::string feats;
            for (ggml_backend_feature * f = get_features(reg); f && f->name; ++f) {
                feats += std::string(feats.empty() ? "" : " ") + f->name + (strcmp(f->value, "1") ? std::string("=") + f->value : "");
            }
            if (!feats.empty()) {
                s += " [" + feats + "]";
            }
        }
    }
    return s;
}
