#include "dspark-acceptance.h"

#include "dspark-context.h"
#include "dspark-draft.h"

#include <algorithm>

// ---- the rules ------------------------------------------------------------------------------------

float dspark_verify_block::bonus_uniform(std::mt19937_64 & aux) {
    if (bonus_u < 0.0f) {
        bonus_u = (float) std::uniform_real_distribution<double>(0.0, 1.0)(aux);
    }
    return bonus_u;
}

std::vector<dspark_token> dspark_acceptor::greedy_chain(const dspark_verify_block & b, const dspark_sampler_params & sp,
                                                        const dspark_rng & rng) const {
    const int k = (int) b.draft.size();
    const int V = tgt.hp().n_vocab;
    const std::vector<float> u = sp.greedy() ? std::vector<float>(k + 1, 0.0f) : rng.peek(k + 1);
    std::vector<dspark_token> out;
    for (int j = 0; j <= k; ++j) {
        const float * adj = b.adjust ? b.adjust + (size_t) j * V : nullptr;  // host sampling only
        const dspark_token t = tgt.has_sampled ? tgt.sampled[b.row + j]
                                               : dspark_sample_host(tgt.logits.data() + (size_t) (b.row + j) * V, V, sp, u[j], adj);
        out.push_back(t);
        if (j == k || t != b.draft[j]) {
            break;
        }
    }
    return out;
}

// q of draft slot j of block b at temperature T over the target vocabulary, from its (filtered,
// Markov-biased) logits: softmax(l / T), 0 where the logits are -inf (unreachable ids).
void dspark_acceptor::draft_q_row(int block, int slot, float T, std::vector<float> & q) const {
    q.resize(dft->hp().n_vocab);
    dft->logits_row(block, slot, q.data());
    dspark_softmax(q, 1.0f / T);
}

// The target's sampling distribution of verify row `row` over the vocabulary (read back first
// when the verify ran in-graph).
void dspark_acceptor::target_p_row(int row, const dspark_sampler_params & sp, std::vector<float> & pd,
                                   const float * adjust) const {
    const int V = tgt.hp().n_vocab;
    std::vector<float> kept;
    const float * logits = tgt.logits.data() + (size_t) row * V;
    if (tgt.has_sampled) {
        kept.resize(V);
        tgt.logits_row(row, kept.data());
        logits = kept.data();
    }
    dspark_distribution dist;
    dspark_sampler_distribution(logits, V, sp, dist, adjust);
    if (!sp.sorts(V)) {  // every token a candidate, in vocabulary order: the probabilities are the row
        pd.swap(dist.probs);
        return;
    }
    pd.assign(V, 0.0f);
    for (size_t c = 0; c < dist.ids.size(); ++c) {
        pd[dist.ids[c]] = dist.probs[c];
    }
}

// A sample of the residual max(p - q, 0) at u in [0, 1): what a rejection emits.
dspark_token dspark_acceptor::residual(const std::vector<float> & pd, const std::vector<float> & q, double u01) const {
    const int V = (int) pd.size();
    double wsum = 0.0;
    for (int v = 0; v < V; ++v) {
        wsum += std::max(0.0f, pd[v] - q[v]);
    }
    if (wsum <= 0.0) {  // p == q up to rounding (a rejection then has probability ~0): p's top token
        return (dspark_token) (std::max_element(pd.begin(), pd.end()) - pd.begin());
    }
    const double u = u01 * wsum;
    double cum = 0.0;
    for (int v = 0; v < V; ++v) {
        cum += std::max(0.0f, pd[v] - q[v]);
        if (u < cum) {
            return v;
        }
    }
    return (dspark_token) (std::max_element(pd.begin(), pd.end()) - pd.begin());
}

// q came with the draw; p from the verify graph, or from the logits on the host. A rejection is
// the only place whole rows are needed: one of p and one of q.
std::vector<dspark_token> dspark_acceptor::rejection(dspark_verify_block & b, const dspark_sampler_params & sp,
                                                     std::mt19937_64 & aux) const {
    const int k = (int) b.draft.size();
    const int V = tgt.hp().n_vocab;
    std::uniform_real_distribution<double> unif(0.0, 1.0);
    const float u_bonus = b.bonus_uniform(aux);
    auto adj = [&](int j) { return b.adjust ? b.adjust + (size_t) j * V : nullptr; };
    std::vector<dspark_token> out;
    std::vector<float> pd, q;
    for (int j = 0; j < k; ++j) {
        const dspark_token x = b.draft[j];
        float px;
        if (tgt.has_sampled) {
            px = tgt.probed[b.row + j];
        } else {
            target_p_row(b.row + j, sp, pd, adj(j));
            px = pd[x];
        }
        if (unif(aux) * b.q[j] < px) {
            out.push_back(x);
            continue;
        }
        if (tgt.has_sampled) {
            target_p_row(b.row + j, sp, pd, adj(j));
        }
        draft_q_row(b.draft_block, j, sp.temperature, q);
        out.push_back(residual(pd, q, unif(aux)));
        return out;
    }
    if (b.cut_banned) {
        // the draft's token at slot k was sampled from q and the constraint bans it (p = 0 there):
        // a certain rejection, so slot k emits a sample of the residual, as verifying it would
        target_p_row(b.row + k, sp, pd, adj(k));
        draft_q_row(b.draft_block, k, sp.temperature, q);
        unif(aux);  // the acceptance test the banned token would have consumed
        out.push_back(residual(pd, q, unif(aux)));
        return out;
    }
    // all drafts accepted: the bonus token, a draw of p at the last row
    if (tgt.has_sampled) {
        out.push_back(tgt.sampled[b.row + k]);
    } else {
        out.push_back(dspark_sample_host(tgt.logits.data() + (size_t) (b.row + k) * V, V, sp, u_bonus, adj(k)));
    }
    return out;
}

// ---- running acceptance -----------------------------------------------------------------------------

// Old blocks fade: acceptance changes along a text (boilerplate, then prose), and a schedule that
// follows the last few dozen steps reacts within a request of a few hundred tokens.
static constexpr double kKeep = 0.95;
// The prior counts as this many blocks: a new sequence starts at the engine's rate and moves to
// its own within a handful of steps.
static constexpr double kPriorWeight = 4.0;
// With no evidence at all a position is accepted with this chance (so the first steps draft, and
// measure, long blocks); it counts as kGuessWeight tests in the pooled conditional, and the pooled
// conditional as kPooledWeight tests of each position: a position must fail several times more
// often than the others before lengths beyond it look worse (it is tested only while they are
// drafted).
static constexpr double kGuess = 0.8;
static constexpr double kGuessWeight = 2.0;
static constexpr double kPooledWeight = 4.0;

dspark_acceptance::dspark_acceptance(int n_pos) : tested(n_pos, 0.0), accepted(n_pos, 0.0) {}

void dspark_acceptance::observe(int k, int n_acc) {
    k = std::min(k, n_pos());
    // positions 0 .. n_acc were tested (the first rejected one included), the first n_acc kept
    for (int j = 0; j < k && j <= n_acc; ++j) {
        tested[j] = kKeep * tested[j] + 1.0;
        accepted[j] = kKeep * accepted[j] + (j < n_acc ? 1.0 : 0.0);
    }
}

double dspark_acceptance::pooled() const {
    double t = 0.0, a = 0.0;
    for (int i = 0; i < n_pos(); ++i) {
        t += tested[i];
        a += accepted[i];
    }
    return (a + kGuessWeight * kGuess) / (t + kGuessWeight);
}

double dspark_acceptance::conditional(int i, const dspark_acceptance * prior) const {
    const double p = prior ? prior->conditional(i, nullptr) : pooled();
    const double w = prior ? kPriorWeight : kPooledWeight;
    return (accepted[i] + w * p) / (tested[i] + w);
}

double dspark_acceptance::survival(int j, const dspark_acceptance * prior) const {
    if (j < 0 || j >= n_pos()) {
        return 0.0;
    }
    double s = 1.0;
    for (int i = 0; i <= j; ++i) {
        s *= conditional(i, prior);
    }
    return s;
}
