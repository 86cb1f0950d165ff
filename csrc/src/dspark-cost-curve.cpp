#include "dspark-cost-curve.h"

#include <algorithm>

// Weight of a new measurement in a running mean: recent steps count most (the cache grows, the
// batch changes), and a single slow step (a graph rebuilt, another process) is diluted.
static constexpr double kNew = 0.25;
// A size measured within this many steps is trusted as measured; older ones fall back to the
// calibrated shape at the current level (so that a choice once measured slow is tried again).
static constexpr uint64_t kFresh = 64;

void dspark_cost_curve::init(int max_size, const std::vector<int> & sizes, const std::vector<double> & ms) {
    prior.assign(max_size + 1, 0.0);
    measured.assign(max_size + 1, 0.0);
    seen_at.assign(max_size + 1, 0);
    scale = 1.0;
    // straight lines between calibrated points, flat beyond the first and the last
    for (int n = 1; n <= max_size; ++n) {
        size_t hi = 0;
        while (hi < sizes.size() && sizes[hi] < n) {
            ++hi;
        }
        if (hi == 0) {
            prior[n] = ms.front() * n / std::max(1, sizes.front());
        } else if (hi == sizes.size()) {
            prior[n] = ms.back() * n / std::max(1, sizes.back());
        } else {
            const double f = (double) (n - sizes[hi - 1]) / (sizes[hi] - sizes[hi - 1]);
            prior[n] = ms[hi - 1] + f * (ms[hi] - ms[hi - 1]);
        }
    }
    // More work never takes less time: a timing below a smaller size's is noise (three runs on a
    // busy machine), and kept it would make the larger size look cheaper than the smaller one
    // for as long as it is not measured again (a 3-row verify below a 1-row decode step: the
    // schedule then drafted two tokens that were never accepted, as if they were free).
    for (int n = 2; n <= max_size; ++n) {
        prior[n] = std::max(prior[n], prior[n - 1]);
    }
}

void dspark_cost_curve::calibrate(int max_size, const std::function<double(int)> & time_ms) {
    std::vector<int> sizes;
    for (int x = 1; x < max_size; x = x < 4 ? x + 1 : (x * 3 + 1) / 2) {
        sizes.push_back(x);
    }
    sizes.push_back(max_size);
    std::vector<double> ms;
    for (int size : sizes) {
        double t[3];
        for (double & ti : t) {
            ti = time_ms(size);
        }
        std::sort(t, t + 3);
        ms.push_back(t[1]);
    }
    init(max_size, sizes, ms);
}

void dspark_cost_curve::observe(int size, double ms, uint64_t now) {
    if (size < 1 || size >= (int) prior.size() || !(ms > 0.0)) {
        return;
    }
    now = std::max<uint64_t>(now, 1);
    const bool fresh = seen_at[size] && now - seen_at[size] <= kFresh;
    measured[size] = fresh ? (1.0 - kNew) * measured[size] + kNew * ms : ms;
    seen_at[size] = now;
    if (prior[size] > 0.0) {
        scale = (1.0 - kNew) * scale + kNew * (ms / prior[size]);
    }
}

double dspark_cost_curve::at(int size, uint64_t now) const {
    if (prior.empty()) {
        return (double) size;  // not initialised: in proportion to the size
    }
    if (size > max_size()) {
        return at(max_size(), now) * size / max_size();
    }
    size = std::max(1, size);
    if (seen_at[size] && now - seen_at[size] <= kFresh) {
        return measured[size];
    }
    return prior[size] * scale;
}
