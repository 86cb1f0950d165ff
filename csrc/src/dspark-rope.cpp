#include "dspark-rope.h"

#include "dspark-impl.h"

#include <cmath>

dspark_rope dspark_rope::from_gguf(const dspark_gguf & f, const std::string & arch, int mode, int n_rot_default,
                                   int n_ctx_train) {
    dspark_rope r;
    r.mode      = mode;
    r.n_rot     = (int) f.get_int(arch + ".rope.dimension_count", n_rot_default);
    r.freq_base = (float) f.get_float(arch + ".rope.freq_base", 10000.0);
    r.n_ctx_orig = (int) f.get_int(arch + ".rope.scaling.original_context_length", n_ctx_train);

    const std::string type = f.get_str(arch + ".rope.scaling.type", "linear");
    double factor = f.get_float(arch + ".rope.scaling.factor", 0.0);
    if (factor == 0.0) {
        factor = f.get_float(arch + ".rope.scale_linear", 0.0);  // older key
    }
    if (type == "none") {
        factor = 0.0;
    } else if (type != "linear" && type != "yarn") {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "rope scaling type '" + type + "' is not supported (none, linear, yarn)");
    }
    r.freq_scale = factor > 0.0 ? (float) (1.0 / factor) : 1.0f;

    // YaRN, as llama.cpp derives it. ggml's rope already scales magnitudes by (1 + 0.1 ln s) when
    // ext_factor != 0, which is HF's default mscale; only a yarn_log_multiplier (mscale_all_dim)
    // changes it, dividing by mscale(s, log_mul) = 1 + 0.1 log_mul ln s.
    if (type == "yarn") {
        r.ext_factor = (float) f.get_float(arch + ".rope.scaling.yarn_ext_factor", 1.0);
        r.beta_fast  = (float) f.get_float(arch + ".rope.scaling.yarn_beta_fast", 32.0);
        r.beta_slow  = (float) f.get_float(arch + ".rope.scaling.yarn_beta_slow", 1.0);
        const float s       = factor > 1.0 ? (float) factor : 1.0f;
        const float log_mul = (float) f.get_float(arch + ".rope.scaling.yarn_log_multiplier", 0.0);
        if (r.ext_factor != 0.0f && s > 1.0f && log_mul != 0.0f) {
            r.attn_factor = 1.0f / (1.0f + 0.1f * log_mul * logf(s));
        }
    }
    r.attn_factor *= (float) f.get_float(arch + ".rope.scaling.attn_factor", 1.0);
    if (r.n_rot <= 0) {
        f.fail(DSPARK_STATUS_BAD_FORMAT, "rope.dimension_count must be positive");
    }
    return r;
}
