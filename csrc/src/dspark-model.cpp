#include "dspark-model.h"

#include "dspark-backend.h"
#include "dspark-impl.h"
#include "models/dflash.h"

dspark_model::dspark_model() = default;
dspark_model::~dspark_model() = default;

dspark_model * dspark_model_load_target(const std::string & path, const dspark_model_params & params) {
    std::unique_ptr<dspark_model> m(new dspark_model());
    m->weights.reset(new dspark_weights(path));
    const dspark_gguf & f = m->file();
    m->arch = f.get_str("general.architecture");
    if (m->arch == "dflash") {
        f.fail(DSPARK_STATUS_INVALID_ARGUMENT, "this is a DFlash/DSpark draft model; load it as a draft for a target");
    }
    if (!dspark_is_target_arch(m->arch)) {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "unknown architecture '" + m->arch + "' (supported: qwen3, llama, qwen2)");
    }
    m->target.reset(new target_model());
    m->target->load(*m->weights);
    m->weights->warn_unused();
    m->weights->load(dspark_device_pick(params.device), params.use_mmap);
    return m.release();
}
