#include "dspark-adjust.h"

#include "dspark-impl.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool dspark_adjuster::wanted(const dspark_request & r) {
    const bool penalty = r.penalty_last_n != 0 &&
                         (r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f ||
                          (r.repeat_penalty != 0.0f && r.repeat_penalty != 1.0f));
    return r.n_logit_bias > 0 || penalty || r.constraint != nullptr;
}

void dspark_adjuster::check(const dspark_request & r, int32_t V) {
    if (r.n_logit_bias < 0 || (r.n_logit_bias > 0 && !r.logit_bias)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "logit_bias: %d entries without an array", r.n_logit_bias);
    }
    for (int32_t i = 0; i < r.n_logit_bias; ++i) {
        const dspark_logit_bias & e = r.logit_bias[i];
        if (e.token < 0 || e.token >= V) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "logit_bias: token %d is outside the vocabulary (0 .. %d)", e.token, V - 1);
        }
        if (std::isnan(e.bias) || e.bias == std::numeric_limits<float>::infinity()) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "logit_bias: the bias of token %d must be a number or -inf, got %g",
                         e.token, (double) e.bias);
        }
    }
    const std::pair<const char *, float> openai[] = {{"presence_penalty", r.presence_penalty},
                                                     {"frequency_penalty", r.frequency_penalty}};
    for (const auto & [name, v] : openai) {
        if (!(v >= -2.0f && v <= 2.0f)) {
            dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "%s must be in [-2, 2], got %g", name, (double) v);
        }
    }
    if (!(r.repeat_penalty >= 0.0f && std::isfinite(r.repeat_penalty))) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "repeat_penalty must be > 0 (0 or 1 = off), got %g", (double) r.repeat_penalty);
    }
    if (r.penalty_last_n < -1) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "penalty_last_n must be -1 (the context), 0 (off) or > 0, got %d",
                     r.penalty_last_n);
    }
    if (r.constraint && (!r.constraint->masks || !r.constraint->commit)) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "constraint: masks and commit callbacks are required");
    }
    if (r.top_logprobs < 0 || r.top_logprobs > DSPARK_MAX_TOP_LOGPROBS) {
        dspark_throw(DSPARK_STATUS_INVALID_ARGUMENT, "top_logprobs must be in 0 .. %d, got %d", DSPARK_MAX_TOP_LOGPROBS,
                     r.top_logprobs);
    }
}

dspark_adjuster::dspark_adjuster(const dspark_request & r, int32_t V, int rows_max)
    : n_vocab(V), n_words((V + 31) / 32), max_rows(rows_max) {
    check(r, V);
    for (int32_t i = 0; i < r.n_logit_bias; ++i) {
        bias[r.logit_bias[i].token] += r.logit_bias[i].bias;
    }
    presence = r.presence_penalty;
    frequency = r.frequency_penalty;
    repeat = r.repeat_penalty == 0.0f ? 1.0f : r.repeat_penalty;
    last_n = r.penalty_last_n < 0 ? INT64_MAX : r.penalty_last_n;
    constraint = r.constraint;
    if (!penalizes()) {
        last_n = 0;
    }
    if (last_n > 0) {
        for (int32_t i = 0; i < r.n_prompt; ++i) {
            history.push_back(r.prompt[i]);
            count_in(r.prompt[i]);
            if ((int64_t) history.size() > last_n) {
                count_out(history[history.size() - 1 - last_n]);
            }
        }
    }
    rows.assign((size_t) max_rows * V, 0.0f);
    touched.resize(max_rows);
    full.assign(max_rows, false);
    if (constraint) {
        masks.assign((size_t) max_rows * n_words, 0u);
    }
}

void dspark_adjuster::count_out(dspark_token t) {
    auto it = counts.find(t);
    if (it != counts.end() && --it->second == 0) {
        counts.erase(it);
    }
}

int dspark_adjuster::ask_masks(const dspark_token * draft, int k) {
    k = std::min(k, max_rows - 1);
    std::fill(masks.begin(), masks.begin() + (size_t) (k + 1) * n_words, 0u);
    const int32_t got = constraint->masks(constraint->user_data, k > 0 ? draft : nullptr, k, masks.data(), n_words);
    if (got < 1 || got > k + 1) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "the constraint's masks callback failed (returned %d for %d tokens)", got, k);
    }
    n_masks = got;
    return got - 1;
}

// Row `row`: the bias, then llama.cpp's penalties on logit + bias of every token in the window
// (repeat: divide a positive logit, multiply a non-positive one; then the frequency and presence
// terms), then the constraint's bans. Additive: what the sampler adds to the raw logit.
void dspark_adjuster::fill_row(const float * logits, const std::unordered_map<dspark_token, int> & c, int row) {
    float * a = rows.data() + (size_t) row * n_vocab;
    std::vector<dspark_token> & t = touched[row];
    for (const auto & [tok, b] : bias) {
        if (!c.count(tok)) {
            a[tok] = b;
            t.push_back(tok);
        }
    }
    for (const auto & [tok, n] : c) {
        const auto bi = bias.find(tok);
        const float b = bi == bias.end() ? 0.0f : bi->second;
        if (repeat != 1.0f) {
            float x = logits[tok] + b;
            x = x <= 0.0f ? x * repeat : x / repeat;
            x -= (float) n * frequency + (float) (n > 0) * presence;
            a[tok] = x - logits[tok];
        } else {
            a[tok] = b - ((float) n * frequency + presence);
        }
        t.push_back(tok);
    }
    if (constraint && row < n_masks) {
        const uint32_t * m = masks.data() + (size_t) row * n_words;
        for (int32_t v = 0; v < n_vocab; ++v) {
            if (!((m[v >> 5] >> (v & 31)) & 1u)) {
                a[v] = kNegInf;
            }
        }
        full[row] = true;
    }
}

const float * dspark_adjuster::fill(const float * logits, const dspark_token * draft, int k) {
    if (k + 1 > max_rows) {
        dspark_throw(DSPARK_STATUS_INTERNAL, "adjustment of %d rows, at most %d", k + 1, max_rows);
    }
    // the window of row i: history + draft[0 .. i), its last last_n tokens
    std::unordered_map<dspark_token, int> c = last_n > 0 ? counts : std::unordered_map<dspark_token, int>();
    const int64_t H = (int64_t) history.size();
    for (int i = 0; i <= k; ++i) {
        if (i > 0 && last_n > 0) {
            c[draft[i - 1]]++;
            const int64_t out = H + i - 1 - last_n;  // the token that leaves the window
            if (out >= 0) {
                const dspark_token t = out < H ? history[out] : draft[out - H];
                auto it = c.find(t);
                if (it != c.end() && --it->second == 0) {
                    c.erase(it);
                }
            }
        }
        fill_row(logits + (size_t) i * n_vocab, c, i);
    }
    return rows.data();
}

void dspark_adjuster::undo() {
    for (int i = 0; i < max_rows; ++i) {
        float * a = rows.data() + (size_t) i * n_vocab;
        if (full[i]) {
            std::fill(a, a + n_vocab, 0.0f);
            full[i] = false;
        } else {
            for (dspark_token t : touched[i]) {
                a[t] = 0.0f;
            }
        }
        touched[i].clear();
    }
    n_masks = 0;
}

void dspark_adjuster::accept(const dspark_token * tokens, int n) {
    if (n <= 0) {
        return;
    }
    if (last_n > 0) {
        for (int i = 0; i < n; ++i) {
            history.push_back(tokens[i]);
            count_in(tokens[i]);
            if ((int64_t) history.size() > last_n) {
                count_out(history[history.size() - 1 - last_n]);
            }
        }
    }
    if (constraint) {
        const int32_t rc = constraint->commit(constraint->user_data, tokens, n);
        if (rc < 0) {
            dspark_throw(DSPARK_STATUS_INTERNAL, "the constraint's commit callback failed (returned %d)", rc);
        }
    }
}
