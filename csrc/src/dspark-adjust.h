// A request's adjustment of the logits: its logit bias, its penalties (llama.cpp's repeat penalty,
// OpenAI's presence and frequency penalties) and its constraint's bans, as one additive row per
// verify row that the sampler chain adds to the logits (dspark-sampler.h, `adjust`).
//
// A penalty depends on the tokens before the row: row i of a verify block (after draft tokens
// d_0 .. d_{i-1}) counts the last penalty_last_n tokens of prompt + output + d_0 .. d_{i-1}, exactly
// what target-only decoding would count at that position; so the adjusted rows, and with them the
// acceptance rules and the logprobs, do not depend on the draft.
//
// Only the touched entries of a row are written (the counted tokens, the biased ones; all banned
// ones for a constraint), and undo() zeroes them again, so a step costs the window, not the
// vocabulary. A sequence without any of these fields has no adjuster at all.
#pragma once

#include "dspark.h"

#include <unordered_map>
#include <vector>

class dspark_adjuster {
  public:
    // Throws INVALID_ARGUMENT naming the first bad field of the request (every request is checked,
    // with an adjuster or without).
    static void check(const dspark_request & r, int32_t n_vocab);
    // The request's adjustment (checked first); the prompt is the start of the penalty window.
    dspark_adjuster(const dspark_request & r, int32_t n_vocab, int max_rows);
    // Does the request ask for an adjustment at all (bias, a penalty or a constraint)?
    static bool wanted(const dspark_request & r);

    bool constrained() const { return constraint != nullptr; }
    // Does a row's adjustment depend on its logits (the repeat penalty)? Else it can be filled
    // before the verify and added inside the graph.
    bool needs_logits() const { return last_n > 0 && repeat != 1.0f; }
    // Ask the constraint for the masks of a block (draft[0 .. k)); returns the draft tokens it
    // allows in a row (the block is cut there). Throws when the callback fails.
    int  ask_masks(const dspark_token * draft, int k);
    // Fill rows 0 .. k of the adjustment for the logits rows [k + 1][n_vocab] of a block after
    // draft[0 .. k) (the masks of the last ask_masks when constrained); returns the rows [k+1][V].
    // `logits` may be null unless needs_logits().
    const float * fill(const float * logits, const dspark_token * draft, int k);
    void undo();  // zero what the last fill wrote
    // Committed tokens: into the penalty window, and to the constraint (throws when it fails).
    void accept(const dspark_token * tokens, int n);

  private:
    struct window_counts;
    void fill_row(const float * logits, const std::unordered_map<dspark_token, int> & counts, int row);

    int32_t n_vocab;
    int     n_words;
    int     max_rows;
    std::unordered_map<dspark_token, float> bias;
    float   presence = 0.0f, frequency = 0.0f, repeat = 1.0f;
    int64_t last_n = 0;                    // the window (INT64_MAX for the whole context); 0: no penalty
    const dspark_constraint * constraint = nullptr;

    std::vector<dspark_token> history;     // prompt + committed output, for the window
    std::unordered_map<dspark_token, int> counts;  // of the window's tokens
    std::vector<uint32_t> masks;           // [max_rows][n_words] of the last ask_masks
    int                   n_masks = 0;
    std::vector<float>    rows;            // [max_rows][n_vocab], zero but for what fill wrote
    std::vector<std::vector<dspark_token>> touched;  // per row: entries written
    std::vector<bool>     full;            // per row: written throughout (a constraint's bans)

    bool penalizes() const { return last_n != 0 && (presence != 0.0f || frequency != 0.0f || repeat != 1.0f); }
    void count_in(dspark_token t) { counts[t]++; }
    void count_out(dspark_token t);
};
