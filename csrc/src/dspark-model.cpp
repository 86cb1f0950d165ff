#include "dspark-model.h"

#include "dspark-backend.h"
#include "dspark-impl.h"
#include "dspark-rpc.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "models/dflash.h"

dspark_model::dspark_model() = default;
dspark_model::~dspark_model() = default;

std::vector<ggml_backend_dev_t> dspark_model::devices() const {
    std::vector<ggml_backend_dev_t> out = weights ? weights->devices : std::vector<ggml_backend_dev_t>();
    if (borrowed) {
        for (ggml_backend_dev_t d : borrowed->devices()) {
            if (std::find(out.begin(), out.end(), d) == out.end()) {
                out.push_back(d);
            }
        }
    }
    return out;
}

std::vector<ggml_backend_buffer_type_t> dspark_model::layer_buffer_types(int n_layer) const {
    std::vector<ggml_backend_buffer_type_t> out(n_layer);
    for (int il = 0; il < n_layer; ++il) {
        const dspark_placement & where = weights->placement;
        ggml_backend_dev_t d = il < (int) where.layers.size() && where.layers[il] ? where.layers[il] : where.main;
        out[il] = ggml_backend_dev_buffer_type(d);
    }
    return out;
}

// Layer il goes to the device whose share of the cumulative split covers (il + 0.5) / n_layer.
static dspark_placement placement_for(const dspark_model_params & params, ggml_backend_dev_t main, int n_layer) {
    dspark_placement where;
    where.main = main;
    const int32_t n_dev = std::min<int32_t>(dspark_device_count_all(), DSPARK_MAX_DEVICES);
    double total = 0.0;
    for (int i = 0; i < DSPARK_MAX_DEVICES; ++i) {
        const float f = params.tensor_split[i];
        if (!(f >= 0.0f) || std::isinf(f)) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "tensor_split[%d] = %g: proportions must be finite and >= 0", i, f);
        }
        if (f > 0.0f && i >= n_dev) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "tensor_split[%d] is set but there are only %d devices", i, n_dev);
        }
        total += f;
    }
    if (total == 0.0) {
        return where;
    }
    where.layers.resize(n_layer);
    for (int il = 0; il < n_layer; ++il) {
        const double at = (il + 0.5) / n_layer * total;
        double cum = 0.0;
        for (int i = 0; i < n_dev; ++i) {
            cum += params.tensor_split[i];
            if (params.tensor_split[i] > 0.0f && at < cum) {
                where.layers[il] = dspark_device_get(i);
                break;
            }
        }
    }
    return where;
}

static std::string names_of(const std::vector<ggml_backend_dev_t> & devices) {
    std::string s;
    for (ggml_backend_dev_t d : devices) {
        s += (s.empty() ? "" : ",") + std::string(ggml_backend_dev_name(d));
    }
    return s;
}

dspark_model * dspark_model_load_target(const std::string & path, const dspark_model_params & params) {
    std::unique_ptr<dspark_model> m(new dspark_model());
    m->weights.reset(new dspark_weights(path));
    const dspark_gguf & f = m->file();
    m->arch = f.get_str("general.architecture");
    if (dspark_is_draft_arch(m->arch)) {
        f.fail(DSPARK_STATUS_INVALID_ARGUMENT, "this is a DFlash/DSpark draft model; load it as a draft for a target");
    }
    if (!dspark_target_arch_find(m->arch)) {
        f.fail(DSPARK_STATUS_UNSUPPORTED, "unknown architecture '" + m->arch + "' (supported: " + dspark_target_arch_names() + ")");
    }
    m->target.reset(new target_model());
    m->target->load(*m->weights);
    if (m->target->hp.n_vocab < 1) {  // a zero-row embedding would make every graph degenerate
        f.fail(DSPARK_STATUS_BAD_FORMAT, "tensor 'token_embd.weight' has no rows (empty vocabulary)");
    }
    m->weights->warn_unused();
    const dspark_placement where = placement_for(params, dspark_device_pick(params.device), (int) m->target->hp.n_layer);
    dspark_rpc_check_alive(where.devices());  // a lost server would be waited on by the upload
    const std::vector<std::string> & tables = m->target->lookup_tables;
    m->weights->load(where, params.use_mmap, params.cpu_repack, std::set<std::string>(tables.begin(), tables.end()));
    m->device_names = names_of(m->weights->devices);
    if (m->target->output == m->target->tok_embd) {  // tied: the lm head's matmuls from a repacked copy
        if (ggml_tensor * copy = m->weights->repacked_copy("token_embd.weight")) {
            m->target->output = copy;
        }
    }
    return m.release();
}

// Read d2t back from the weights and check it: every id inside the target vocabulary, no id twice.
static std::vector<int32_t> read_d2t(const dspark_model & m) {
    ggml_tensor * t = m.draft->d2t;
    std::vector<int64_t> ids(t->ne[0]);
    ggml_backend_tensor_get(t, ids.data(), 0, ggml_nbytes(t));
    const int64_t V = m.draft->hp.n_vocab;
    std::vector<bool> seen(V, false);
    std::vector<int32_t> out(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
        if (ids[j] < 0 || ids[j] >= V) {
            m.file().fail(DSPARK_STATUS_BAD_FORMAT, "d2t[" + std::to_string(j) + "] = " + std::to_string(ids[j]) +
                                                        " is outside the target vocabulary (" + std::to_string(V) + ")");
        }
        if (seen[ids[j]]) {
            m.file().fail(DSPARK_STATUS_BAD_FORMAT, "d2t maps two draft ids to target id " + std::to_string(ids[j]));
        }
        seen[ids[j]] = true;
        out[j] = (int32_t) ids[j];
    }
    return out;
}

dspark_model * dspark_model_load_draft(const std::string & path, const dspark_model * target,
                                       const dspark_model_params & params) {
    if (target && !target->target) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "%s: the model given as target is not a target model", path.c_str());
    }
    std::unique_ptr<dspark_model> m(new dspark_model());
    m->weights.reset(new dspark_weights(path));
    const dspark_gguf & f = m->file();
    m->arch = f.get_str("general.architecture");
    if (!dspark_is_draft_arch(m->arch)) {
        f.fail(DSPARK_STATUS_INVALID_ARGUMENT, "architecture '" + m->arch + "' is not a DFlash/DSpark draft (expected 'dflash')");
    }
    m->borrowed = target;
    m->draft.reset(new dflash_model());
    m->draft->load(*m->weights, target ? target->target.get() : nullptr, target ? target->path() : "",
                   params.draft_sample_from_anchor, params.draft_layer_offset);
    m->weights->warn_unused();
    // -1 with a target: the target's device, so by default both models share one device
    ggml_backend_dev_t dev = target && params.device == -1 ? target->device() : dspark_device_pick(params.device);
    const dspark_placement where = placement_for(params, dev, (int) m->draft->hp.n_layer);
    dspark_rpc_check_alive(where.devices());
    m->weights->load(where, params.use_mmap, params.cpu_repack,
                     {"token_embd.weight", "markov_w1.weight", "markov_w2.weight"});  // (row lookups)
    m->device_names = names_of(m->weights->devices);
    if (m->draft->d2t) {
        m->d2t = read_d2t(*m);
    }
    return m.release();
}
