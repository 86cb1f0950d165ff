// How long a block to draft this step, from what steps cost and what drafts are worth: for each
// length K (0 = no draft) the expected tokens of the step (per sequence 1 + the survival of its
// first K drafts) over its expected time (drafting the sequences at K, verifying their
// n_seq * (K + 1) tokens, the time between steps spent outside the engine, and what recent steps
// with or without a draft took beyond those curves). As the batch grows
// the verify stops getting cheaper per token and the draft costs more, so K shrinks, down to no
// draft at all. One K for the whole step: the draft runs one graph for all sequences.
#pragma once

#include "dspark-acceptance.h"
#include "dspark-cost-curve.h"

#include <vector>

struct dspark_context;
struct dspark_draft_context;

struct dspark_block_schedule {
    dspark_cost_curve              verify;  // by verify tokens
    std::vector<dspark_cost_curve> draft;   // [K] by drafting sequences (K = 1 .. n_max)
    dspark_acceptance              accept;  // engine-wide, the prior of each sequence's own

    void init(int n_max);  // then the curves' own init
    // init, and the curves' shapes timed on the (empty) caches of the engine's contexts: the
    // target's verify at a few batch sizes (blocks of n_max + 1 rows, one sequence each), and the
    // draft's proposal of each block length at a few sequence counts. What steps measure later
    // overrides and rescales them (the caches grow; other work shares the machine). Throws when a
    // cache is not empty or too small.
    void calibrate(dspark_context & tgt, dspark_draft_context & dft, int n_max, int markov_top_k);
    // DSpark's hardware-aware prefix scheduler (the confidence schedule): cut each sequence's
    // drafted block (draft and conf) to the prefix worth verifying, from the confidences;
    // fixed_rows more rows (blocks not cut) join the verify.
    void cut_by_confidence(const std::vector<dspark_verify_block *> & blocks, int fixed_rows = 0) const;
    // One K in 0 .. n_max for sequences whose own acceptance is `seqs` and draft budgets `budget`
    // (a sequence drafts min(K, its budget) tokens); K below n_min is no draft.
    int choose(const std::vector<const dspark_acceptance *> & seqs, const std::vector<int> & budget, int n_min);
    // Time between the end of the last step and the start of this one (capped: an idle server is
    // not a cost of stepping).
    void observe_gap(double ms, double last_step_ms);
    // The whole of the step just run (of the length choose returned): what it cost beyond the two
    // curves' prediction (a draft catching up after steps without one, graphs rebuilt for a new
    // length, the host's work) is added to the cost of every length of its kind from now on.
    void observe_step(double ms);
    // The schedule's clock, in steps (what the cost curves age their measurements by).
    uint64_t now() const { return (uint64_t) n_steps + 1; }
    // Expected tokens per ms of a step of length K (what choose maximises).
    double rate(const std::vector<const dspark_acceptance *> & seqs, const std::vector<int> & budget, int K) const;

  private:
    int    n_max = 0;
    double gap_ms = 0.0;
    double extra_ms[2] = {0.0, 0.0};  // running unmodeled time of steps without [0] and with [1] a draft
    int    chosen = -1;               // the length choose returned last, and the curves' time for it
    double chosen_ms = 0.0;
    bool   explored = false;          // whether that length was a try
    double plain_ms = 0.0;            // running time of a step that is not a try
    double explore_cost_ms = 0.0;     // what the last try cost beyond one
    double since_explore_ms = 0.0;    // time of the steps since the last try

    double modeled_ms(const std::vector<const dspark_acceptance *> & seqs, const std::vector<int> & budget, int K,
                      double * tokens) const;
    long   n_steps = 0;
    long   next_explore = 1, explore_every = 16;  // the first step is a try
    int    last_best = -1;
    int    explore_phase = 0;                     // which try comes next: longest, shorter, longer, shorter

    int explore(int best, int n_min);
};
