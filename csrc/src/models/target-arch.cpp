#include "models/target-arch.h"

// Defined by each architecture's file.
extern const target_arch_info dspark_arch_llama;     // models/llama.cpp
extern const target_arch_info dspark_arch_qwen2;     // models/qwen2.cpp
extern const target_arch_info dspark_arch_qwen3;     // models/qwen3.cpp
extern const target_arch_info dspark_arch_qwen3moe;  // models/qwen3moe.cpp
extern const target_arch_info dspark_arch_gemma3;    // models/gemma3.cpp
extern const target_arch_info dspark_arch_gemma4;    // models/gemma4.cpp

static const target_arch_info * const k_target_archs[] = {
    &dspark_arch_qwen3, &dspark_arch_llama, &dspark_arch_qwen2, &dspark_arch_qwen3moe, &dspark_arch_gemma3,
    &dspark_arch_gemma4,
};

const target_arch_info * dspark_target_arch_find(const std::string & name) {
    for (const target_arch_info * a : k_target_archs) {
        if (name == a->name) {
            return a;
        }
    }
    return nullptr;
}

std::string dspark_target_arch_names() {
    std::string s;
    for (const target_arch_info * a : k_target_archs) {
        s += (s.empty() ? "" : ", ") + std::string(a->name);
    }
    return s;
}

bool dspark_is_draft_arch(const std::string & name) {
    return name == "dflash";
}
