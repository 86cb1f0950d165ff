// The time one part of a speculative step takes as a function of its size (verify: the batch's
// tokens; draft: the drafting sequences, one curve per block length). A calibration on the empty
// cache gives the curve's shape; what the engine measures while it runs overrides it where fresh,
// and sets its level elsewhere (costs grow with the cache, which the calibration did not see).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

struct dspark_cost_curve {
    // Sizes 1 .. max_size; the calibrated points in between are joined by straight lines.
    void init(int max_size, const std::vector<int> & sizes, const std::vector<double> & ms);
    // init from timings: time_ms(size) runs the computation once at that size and returns its
    // milliseconds; each of a few sizes up to max_size (every one to 4, then about 1.5x apart, and
    // max_size itself) takes the median of three runs.
    void calibrate(int max_size, const std::function<double(int)> & time_ms);
    // A measured time of a computation of this size at step `now` (the caller's clock: a curve
    // whose sizes are not run for a while must see its measurements age).
    void observe(int size, double ms, uint64_t now);
    // The expected time at this size (beyond max_size: in proportion, as several computations).
    double at(int size, uint64_t now) const;
    int max_size() const { return (int) prior.size() - 1; }

  private:
    std::vector<double>   prior;     // calibrated (interpolated), by size
    std::vector<double>   measured;  // running mean of what was seen, by size (0: never)
    std::vector<uint64_t> seen_at;   // the step each size was last measured at (0: never)
    double                scale = 1.0;  // running mean of measured / calibrated
};
